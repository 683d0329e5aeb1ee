"""What optimizer plugins provide.

An *inner* optimizer is JAX-traceable and is compiled into the device program (it
runs on the worker's accelerator). An *outer* optimizer runs on the shepherd in
NumPy float32 over the averaged pseudo-gradient.
"""

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

T = TypeVar("T")
# The schedule a train program carries as state, while its step is traced (schedule_from).
# After the warmup (`--lr-schedule`); a schedule's kind is its index here
SCHEDULES = ("cosine", "linear", "constant", "wsd")
SCHEDULE_VALUES = 6  # the length of `schedule_values`
_SCHEDULE: contextvars.ContextVar[Any | None] = contextvars.ContextVar("pcp_schedule", default=None)


@dataclass(frozen=True)
class InnerSettings:
    """What every inner (per-step, on-device) optimizer is given: the run's schedule and
    clip, and its own settings (`own`: an instance of the dataclass it declares as
    `InnerOptimizer.settings`, e.g. AdamW's betas; None outside a run, where it uses its
    defaults)."""

    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 20
    total_steps: int = 1000
    schedule: str = "cosine"  # after the warmup: one of SCHEDULES
    decay_steps: int = 0  # wsd: the final decay's steps
    grad_clip: float = 1.0  # global-norm clip; 0 disables it
    own: Any = None


def own_settings(settings: InnerSettings, declared: type[T]) -> T:
    """The optimizer's own settings in `settings`: `settings.own`, or `declared`'s
    defaults where none were given (a program built outside a run)."""
    if settings.own is None:
        return declared()
    if not isinstance(settings.own, declared):
        raise TypeError(f"expected {declared.__name__} settings, got {type(settings.own).__name__}")
    return settings.own


def learning_rate(settings: InnerSettings) -> Any:
    """PCP's inner schedule: linear warmup from 0 to `lr`, then `settings.schedule`:
    cosine decay to `min_lr` at `total_steps` (optax's `warmup_cosine_decay_schedule`,
    step for step), a linear one, `lr` held constant, or warmup-stable-decay (`lr`, then
    linear to `min_lr` over the last `decay_steps`).

    Inside `schedule_from(values)` (a train program that carries its schedule as state,
    see `pcp_core.program.build`) it reads `schedule_values` from `values` instead of
    `settings`, so one compiled program serves every schedule."""

    def schedule(count: Any) -> Any:
        values = _SCHEDULE.get()
        if values is None:
            values = schedule_values(settings)
        return warmup_then(count, *(values[i] for i in range(SCHEDULE_VALUES)))

    return schedule


def schedule_values(settings: InnerSettings) -> np.ndarray:
    """`settings`' schedule as the float32 [lr, min_lr, warmup, total, kind, decay steps]
    a program that carries it reads (kind: the index in SCHEDULES; exact for step counts
    below 2**24)."""
    values = [settings.lr, settings.min_lr, settings.warmup_steps, settings.total_steps]
    values += [SCHEDULES.index(settings.schedule), settings.decay_steps]
    return np.array(values, dtype=np.float32)


@contextlib.contextmanager
def schedule_from(values: Any) -> Iterator[None]:
    """`learning_rate`'s schedules read `values` (traced: the program's state) here."""
    token = _SCHEDULE.set(values)
    try:
        yield
    finally:
        _SCHEDULE.reset(token)


def warmup_then(
    count: Any, lr: Any, min_lr: Any, warmup: Any, total: Any, kind: Any, decay_steps: Any
) -> Any:
    """The rate at step `count`, in jax: constants or traced values alike."""
    import jax.numpy as jnp

    count = jnp.asarray(count, jnp.float32)
    warmup = jnp.maximum(jnp.asarray(warmup, jnp.float32), 0.0)
    total = jnp.asarray(total, jnp.float32)
    decay = jnp.maximum(total, warmup + 1.0) - warmup
    lr = jnp.asarray(lr, jnp.float32)
    rising = (0.0 - lr) * (1.0 - count / jnp.maximum(warmup, 1.0)) + lr
    alpha = jnp.where(lr == 0.0, 0.0, min_lr / jnp.where(lr == 0.0, 1.0, lr))
    cosine = 0.5 * (1.0 + jnp.cos(jnp.pi * jnp.minimum(count - warmup, decay) / decay))
    linear = 1.0 - jnp.minimum(count - warmup, decay) / decay
    decay_steps = jnp.maximum(jnp.asarray(decay_steps, jnp.float32), 1.0)
    stable_then = 1.0 - jnp.clip((count - (total - decay_steps)) / decay_steps, 0.0, 1.0)
    kind = jnp.asarray(kind, jnp.float32)
    fraction = jnp.where(
        kind == 0.0,
        cosine,
        jnp.where(kind == 1.0, linear, jnp.where(kind == 2.0, 1.0, stable_then)),
    )
    after = jnp.where(kind == 2.0, lr, lr * ((1.0 - alpha) * fraction + alpha))
    return jnp.where(count < warmup, rising, after)


def clipped(settings: InnerSettings, step: "GradientTransformation") -> "GradientTransformation":
    """`step` after global-norm clipping at `settings.grad_clip` (0: no clipping)."""
    import optax

    if settings.grad_clip > 0:
        return optax.chain(clip_by_global_norm(settings.grad_clip), step)
    return step


def clip_by_global_norm(max_norm: float) -> "GradientTransformation":
    """optax.clip_by_global_norm as a multiplication by `clip_scale`: below the limit
    the gradients pass unchanged.

    optax's form, `select(‖g‖ < max_norm, g, g / ‖g‖ · max_norm)`, chooses with a
    scalar predicate, which IREE reads back to the host to pass to the update
    dispatches: every step then waited for the GPU to finish the backward pass before
    the optimizer could be recorded (about 7 ms of a 24 ms bf16 step on an H100 idle
    between kernels). A scale factor stays on the device.
    """
    import jax
    import optax

    def update(updates, state, params=None):
        del params
        scale = clip_scale(updates, max_norm)
        return jax.tree_util.tree_map(lambda t: t * scale.astype(t.dtype), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


PARTIAL_SUMS_MULTIPLE = 1024


def clip_scale(grads: Any, max_norm: float) -> Any:
    """min(1, max_norm / ‖g‖) over the whole tree of gradients, a float32 scalar on the
    device; 1.0 when `max_norm` is 0 (no clipping).

    Each gradient's squares are summed along its last axis, and those partial sums
    joined into one vector and summed. IREE sums a whole tensor to one scalar with a
    single workgroup (16 us for a 384x1536 gradient on an H100, where its bytes need
    about 2); row by row, every row has its own. The partial sums go into one buffer,
    so the last sum reads one binding: one sum over the scalars, each at its own offset,
    would outnumber the 64 push constants a CUDA dispatch may take. Zeros pad that
    vector to a multiple of `PARTIAL_SUMS_MULTIPLE`: IREE sums a length it cannot
    split among threads (16485 at gpt-b32) with one thread.
    """
    import jax
    import jax.numpy as jnp

    if max_norm <= 0:
        return jnp.float32(1.0)
    leaves = jax.tree_util.tree_leaves(grads)
    rows = [t.astype(jnp.float32).reshape(-1, t.shape[-1] if t.ndim else 1) for t in leaves]
    partial_sums = [jnp.sum(jnp.square(r), axis=-1) for r in rows]
    count = sum(int(p.shape[0]) for p in partial_sums)
    padding = jnp.zeros([-count % PARTIAL_SUMS_MULTIPLE], jnp.float32)
    squares = jnp.concatenate([*partial_sums, padding])
    return jnp.minimum(1.0, max_norm / jnp.sqrt(jnp.sum(squares)))


class GradientTransformation(Protocol):
    """optax's interface: `update` returns additive updates and the new state."""

    def init(self, params: Any) -> Any: ...

    def update(self, grads: Any, state: Any, params: Any) -> tuple[Any, Any]: ...


@dataclass(frozen=True)
class InnerOptimizer:
    name: str
    build: Callable[[InnerSettings], GradientTransformation]
    description: str = ""
    role: str = "inner"
    # The field of its state that holds a running average of past gradients (AdamW's
    # first moment `mu`), which DiLoCo's workers zero at the start of a round (see
    # DilocoSettings.inner_momentum); None: nothing in its state is momentum.
    momentum_field: str | None = None
    # The name of its own setting that is that momentum's decay (AdamW's `beta1`), which
    # DiLoCo sets for its workers where the user left it at its default (see
    # DilocoSettings.inner_momentum_decay); None: it has none.
    momentum_decay_setting: str | None = None
    # The field of its state that its learning-rate schedule reads, a step counter:
    # DiLoCo's budgeted rounds set it to the run's position (DilocoSettings.round_budget),
    # so nothing else (a bias correction, say) should read it; None: none, the schedule
    # then follows the worker's own steps.
    step_field: str | None = None
    # Its own settings, if any: a dataclass of `pcp_core.settings.setting` fields (flags
    # and a TOML section named after it); read with `config.settings(name)`.
    settings: type | None = None


@dataclass(frozen=True)
class OuterSettings:
    """Hyperparameters of the outer optimizer (PCP's defaults; DiLoCo passes its
    `--outer-lr` and `--outer-momentum`)."""

    lr: float = 1.0
    momentum: float = 0.7


class OuterStep(Protocol):
    """Applies one outer step in place: `params` and the step's state are float32 arrays."""

    def __call__(self, params: list[np.ndarray], delta: list[np.ndarray]) -> None: ...

    def state(self) -> dict[str, np.ndarray]: ...

    def load_state(self, state: dict[str, np.ndarray]) -> None: ...


@dataclass(frozen=True)
class OuterOptimizer:
    name: str
    create: Callable[[OuterSettings, list[np.ndarray]], OuterStep]
    description: str = ""
    role: str = "outer"
    # Its own settings, if any: a dataclass of `pcp_core.settings.setting` fields (flags
    # and a TOML section named after it); read with `config.settings(name)`.
    settings: type | None = None
