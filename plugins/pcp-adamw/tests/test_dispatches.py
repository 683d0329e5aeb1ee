"""How IREE compiles the update: one dispatch a parameter for both moments and the parameter."""

import re

import numpy as np
import pcp_adamw

from pcp_core.optimizers import InnerSettings


def dispatch_names() -> list[str]:
    """The dispatches IREE launches for one clipped AdamW update of three parameters."""
    import jax
    import jax.numpy as jnp

    from pcp_core.iree.compile_process import compile_stablehlo
    from pcp_core.program.build import without_locations

    params = {"matrix": np.zeros((64, 32), np.float32), "bias": np.zeros(32, np.float32)}
    params["gain"] = np.ones(32, np.float32)
    tx = pcp_adamw.build(InnerSettings(grad_clip=1.0))

    def step(params, grads, state):
        updates, state = tx.update(grads, state, params)
        return jax.tree_util.tree_map(jnp.add, params, updates), state

    state = tx.init(params)
    exported = jax.export.export(jax.jit(step))(params, params, state)
    stream = compile_stablehlo(
        without_locations(exported.mlir_module()), "llvm-cpu", ["--compile-to=stream"]
    ).decode()
    return re.findall(r"stream\.cmd\.dispatch @\w+::@(\w+)", stream)


def test_each_parameter_is_updated_in_one_dispatch() -> None:
    """optax's clip chained with its adamw took two elementwise dispatches a parameter:
    the moments, then the parameter update reading them back."""
    names = dispatch_names()
    over_parameters = [n for n in names if re.search(r"elementwise_(32|2048)_f32$", n)]
    assert len(over_parameters) == 3, names
