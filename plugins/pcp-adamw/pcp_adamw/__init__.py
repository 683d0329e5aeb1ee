"""AdamW for PCP: decoupled weight decay, bias correction, global-norm clipping,
linear warmup then cosine decay. Step for step it matches
`torch.nn.utils.clip_grad_norm_` followed by `torch.optim.AdamW` with the same
learning rate schedule. Weight decay applies to matrices only (ndim >= 2), as in
nanoGPT: biases, norms' gains are not decayed.

Written out rather than chained from optax's clip and adamw so that IREE compiles each
parameter's whole update, both moments and the parameter, into one dispatch. Chained,
the clipped gradient g·s is one tensor that both moments read, and IREE then puts the
moments in one dispatch and the parameter update, which reads them back, in a second:
two launches a parameter, 76 of them a step at gpt-b32, most too small to cost more
than their launch. Here each moment multiplies g by its own scalar, (1−β₁)·s and
(1−β₂)·s², so nothing is shared but g itself.
"""

from dataclasses import dataclass
from typing import Any, NamedTuple

from pcp_core import hookimpl
from pcp_core.optimizers import (
    GradientTransformation,
    InnerOptimizer,
    InnerSettings,
    clip_scale,
    learning_rate,
    own_settings,
)
from pcp_core.settings import setting

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for


@dataclass(frozen=True)
class AdamWSettings:
    """AdamW's own settings: the `[adamw]` section of a run's TOML, and their flags."""

    beta1: float = setting(
        0.9,
        "First-moment decay (beta1). Left at 0.9, DiLoCo's workers without overlapped "
        "rounds take 0.7 up to eight workers, 0.8 beyond (its setting "
        "inner-momentum-decay).",
        low=0,
        high=1,
        high_open=True,
    )
    beta2: float = setting(0.99, "Second-moment decay (beta2).", low=0, high=1, high_open=True)
    eps: float = setting(1e-8, "Added to the second moment's root.", low=0, low_open=True)
    weight_decay: float = setting(0.1, "Decoupled weight decay (matrices only).", low=0)


class AdamWState(NamedTuple):
    count: Any  # int32 scalar: steps taken, which the moments' bias correction follows
    # int32 scalar: where the learning-rate schedule is. Apart from `count`, because
    # DiLoCo's budgeted rounds set it to the run's position at each round's start: a
    # slow worker's schedule keeps pace with the run, while its moments, built from
    # the few steps it really took, keep the bias correction of those (corrected as if
    # from thousands of steps, they made its first updates several times too large).
    schedule_step: Any
    mu: Any  # first moments, a tree like the parameters
    nu: Any  # second moments, a tree like the parameters


def build(settings: InnerSettings) -> GradientTransformation:
    import jax
    import jax.numpy as jnp
    import optax

    schedule = learning_rate(settings)
    own = own_settings(settings, AdamWSettings)
    b1, b2, eps, decay = own.beta1, own.beta2, own.eps, own.weight_decay

    def init(params: Any) -> AdamWState:
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        step = jnp.zeros([], jnp.int32)
        return AdamWState(step, step, zeros, zeros)

    def update(grads: Any, state: AdamWState, params: Any) -> tuple[Any, AdamWState]:
        lr = schedule(state.schedule_step)
        count = state.count + 1
        steps = count.astype(jnp.float32)
        first_correction, second_correction = 1 - b1**steps, 1 - b2**steps
        scale = clip_scale(grads, settings.grad_clip)
        mu = jax.tree_util.tree_map(lambda g, m: b1 * m + ((1 - b1) * scale) * g, grads, state.mu)
        nu = jax.tree_util.tree_map(
            lambda g, v: b2 * v + (((1 - b2) * scale * scale) * g) * g, grads, state.nu
        )

        def step(m, v, p):
            direction = (m / first_correction) / (jnp.sqrt(v / second_correction) + eps)
            return -lr * (direction + decay * p if p.ndim >= 2 else direction)

        updates = jax.tree_util.tree_map(step, mu, nu, params)
        return updates, AdamWState(count, state.schedule_step + 1, mu, nu)

    return optax.GradientTransformation(init, update)


ADAMW = InnerOptimizer(
    name="adamw",
    build=build,
    description="AdamW with warmup + cosine decay",
    momentum_field="mu",
    momentum_decay_setting="beta1",
    step_field="schedule_step",
    settings=AdamWSettings,
)


@hookimpl
def pcp_register_optimizers(register) -> None:
    register(ADAMW)
