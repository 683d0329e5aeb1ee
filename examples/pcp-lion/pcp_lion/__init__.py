"""Lion: the sign of an interpolated momentum, with decoupled weight decay.

For a gradient g, momentum m, parameters θ and learning rate η:
    update = −η · (sign(β₁·m + (1−β₁)·g) + λ·θ)      (λ on matrices only)
    m ← β₂·m + (1−β₂)·g
with PCP's usual schedule (linear warmup, then cosine decay) and global-norm clipping.
"""

from dataclasses import dataclass
from typing import Any, NamedTuple

from pcp_core import hookimpl
from pcp_core.optimizers import (
    GradientTransformation,
    InnerOptimizer,
    InnerSettings,
    clipped,
    learning_rate,
    own_settings,
)
from pcp_core.settings import setting

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for


@dataclass(frozen=True)
class LionSettings:
    """Lion's own settings: the `[lion]` section of a run's TOML, and their flags."""

    beta1: float = setting(
        0.9,
        "Interpolation of momentum and gradient for the sign (beta1).",
        low=0,
        high=1,
        high_open=True,
    )
    beta2: float = setting(0.99, "Momentum decay (beta2).", low=0, high=1, high_open=True)
    weight_decay: float = setting(0.1, "Decoupled weight decay (matrices only).", low=0)


class LionState(NamedTuple):
    count: Any  # int32 scalar: steps taken
    momentum: Any  # a tree like the parameters


def build(settings: InnerSettings) -> GradientTransformation:
    import jax
    import jax.numpy as jnp
    import optax

    schedule = learning_rate(settings)
    own = own_settings(settings, LionSettings)
    b1, b2, decay = own.beta1, own.beta2, own.weight_decay

    def init(params: Any) -> LionState:
        return LionState(jnp.zeros([], jnp.int32), jax.tree_util.tree_map(jnp.zeros_like, params))

    def update(grads: Any, state: LionState, params: Any) -> tuple[Any, LionState]:
        lr = schedule(state.count)

        def step(g, m, p):
            direction = jnp.sign(b1 * m + (1 - b1) * g)
            return -lr * (direction + decay * p if p.ndim >= 2 else direction)

        updates = jax.tree_util.tree_map(step, grads, state.momentum, params)
        momentum = jax.tree_util.tree_map(lambda g, m: b2 * m + (1 - b2) * g, grads, state.momentum)
        return updates, LionState(state.count + 1, momentum)

    return clipped(settings, optax.GradientTransformation(init, update))


LION = InnerOptimizer(
    name="lion",
    build=build,
    description="Lion (sign momentum), an example",
    step_field="count",
    settings=LionSettings,
)


@hookimpl
def pcp_register_optimizers(register) -> None:
    register(LION)
