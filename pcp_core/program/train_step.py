"""The step of a train program (`pcp_core.program.build.build_train_program`): K inner
steps of the model's gradient and the optimizer's update, and the optimizer's initial state.
"""

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from pcp_core.optimizers import GradientTransformation, schedule_from
from pcp_core.program.mesh import data_parallel


def k_steps(
    names: list[str],
    opt_count: int,
    opt_treedef: Any,
    optimizer: GradientTransformation,
    gradient: Callable,
) -> Callable:
    """The step of a train program: K steps in a scan, a carried schedule applied to each."""
    import jax
    import jax.numpy as jnp

    # keep its name: the exported module is named after it ("jit_train_step")
    def train_step(params_tuple, opt_tuple, inputs, targets, unroll=False):
        params = dict(zip(names, params_tuple, strict=True))
        opt_tuple, values = opt_tuple[:opt_count], opt_tuple[opt_count:]
        opt_state = jax.tree_util.tree_unflatten(opt_treedef, opt_tuple)

        def one_step(carry, batch):
            params, opt_state = carry
            loss, grads = gradient(data_parallel(params), batch)
            with schedule_from(values[0]) if values else contextlib.nullcontext():
                updates, opt_state = optimizer.update(grads, opt_state, params)
            params = data_parallel(jax.tree_util.tree_map(jnp.add, params, updates))
            return (params, opt_state), loss

        (params, opt_state), losses = jax.lax.scan(
            one_step, (params, opt_state), (inputs, targets), unroll=unroll
        )
        return (
            tuple(params[n] for n in names),
            tuple(jax.tree_util.tree_leaves(opt_state)) + tuple(values),
            losses,
        )

    return train_step


def opt_state_init(
    names: list[str], optimizer: GradientTransformation, schedule: np.ndarray | None
) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """The optimizer's initial state for given parameters, the schedule's tensor last."""
    import jax

    @jax.jit
    def init_opt(params_tuple):
        state = optimizer.init(dict(zip(names, params_tuple, strict=True)))
        return tuple(jax.tree_util.tree_leaves(state))

    def init_opt_state(params: list[np.ndarray]) -> list[np.ndarray]:
        state = [np.asarray(a) for a in init_opt(tuple(params))]
        return state if schedule is None else [*state, np.asarray(schedule, np.float32)]

    return init_opt_state


def accumulated(loss_of: Callable, micro_batches: int) -> Callable:
    """(params, (inputs, targets)) -> the loss and its gradient over the batch, in
    `micro_batches` pieces one after another (their mean: the pieces are equal)."""
    import jax
    import jax.numpy as jnp

    def whole(params: Any, batch: Any) -> Any:
        return jax.value_and_grad(loss_of)(params, *data_parallel(batch, batch=True))

    if micro_batches == 1:
        return whole

    def accumulated(params: Any, batch: Any) -> Any:
        pieces = tuple(b.reshape(micro_batches, -1, *b.shape[1:]) for b in batch)

        def add(total: Any, piece: Any) -> Any:
            return jax.tree_util.tree_map(jnp.add, total, whole(params, piece)), None

        zero = (jnp.zeros((), jnp.float32), jax.tree_util.tree_map(jnp.zeros_like, params))
        total, _ = jax.lax.scan(add, zero, pieces)
        return jax.tree_util.tree_map(lambda value: value / micro_batches, total)

    return accumulated
