"""How a program for several devices lies on them: one mesh axis, the batch split over
it, the parameters whole on each device, the optimizer's moments split (ZeRO stage 1).

`platform_export.exporting_for` sets the mesh a step is traced for (`export_mesh`); the
model and the train step read it here to place what they compute.
"""

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

# The mesh axis a program exported for several devices splits its batch over.
DATA_AXIS = "data"

# The mesh of devices a program is being exported for while its step is traced, None for
# one device (see `export_mesh`).
_EXPORT_MESH: contextvars.ContextVar[Any] = contextvars.ContextVar("pcp_export_mesh", default=None)


def data_mesh(devices: int | list[Any]) -> Any:
    """The mesh of `devices` (jax devices) along `DATA_AXIS`, or an `AbstractMesh` of that
    many. Its axis is Auto (XLA propagates the shardings the program names) on both the
    exporting and the running side: jax 0.11 made Explicit the default, and a program
    exported for one kind runs on no mesh of the other."""
    import jax

    axis_types = (jax.sharding.AxisType.Auto,)
    if isinstance(devices, int):
        return jax.sharding.AbstractMesh((devices,), (DATA_AXIS,), axis_types=axis_types)
    return jax.sharding.Mesh(np.array(devices), (DATA_AXIS,), axis_types=axis_types)


def export_mesh() -> Any:
    """The mesh of devices the step being traced is exported for: None for one device
    (all but a worker that trains on several, `pcp worker --devices`); a `Mesh` of this
    process's own devices where it has as many of the platform's (the shepherd of a
    machine's local workers), else an `AbstractMesh` of that shape (see `devices_at_hand`)."""
    return _EXPORT_MESH.get()


def devices_at_hand() -> bool:
    """Whether the step being traced is lowered with its devices present: for one device,
    or a mesh of this process's own. jax lowers some calls only so (cuDNN's attention);
    a model keeps the portable form of such a call elsewhere."""
    import jax

    mesh = export_mesh()
    return mesh is None or isinstance(mesh, jax.sharding.Mesh)


@contextlib.contextmanager
def exported_on(platform: str | None, devices: int) -> Iterator[None]:
    """Trace inside this block for `devices` devices of `platform` (see `export_mesh`)."""
    token = _EXPORT_MESH.set(_mesh_for(platform, devices) if devices > 1 else None)
    try:
        yield
    finally:
        _EXPORT_MESH.reset(token)


def _mesh_for(platform: str | None, devices: int) -> Any:
    import jax

    try:
        present = jax.devices(platform) if platform else []
    except RuntimeError:  # no such platform in this jaxlib
        present = []
    return data_mesh(present[:devices] if len(present) >= devices else devices)


def split_state(shape: tuple[int, ...], devices: int) -> Any:
    """How an optimizer-state tensor of `shape` lies on a mesh of `devices`: split along
    its first axis that divides evenly, else whole on each device (a scalar, a step)."""
    from jax.sharding import PartitionSpec

    for axis, size in enumerate(shape):
        if size % devices == 0:
            return PartitionSpec(*([None] * axis), DATA_AXIS)
    return PartitionSpec()


def placed_on(mesh: Any, opt_shapes: list[tuple[int, ...]]) -> dict[str, Any]:
    """jit's shardings for a train step on `mesh`: parameters whole, the [K, batch, block]
    inputs split along the batch, each optimizer-state tensor as `split_state` says;
    none on one device (`mesh` None)."""
    if mesh is None:
        return {}
    from jax.sharding import NamedSharding, PartitionSpec

    whole = NamedSharding(mesh, PartitionSpec())
    split = NamedSharding(mesh, PartitionSpec(None, DATA_AXIS))
    state = tuple(NamedSharding(mesh, split_state(shape, mesh.size)) for shape in opt_shapes)
    return {"in_shardings": (whole, state, split, split), "out_shardings": (whole, state, whole)}


def data_parallel(tree: Any, batch: bool = False) -> Any:
    """`tree` pinned, in a step exported for several devices, to lie whole on each device
    (the parameters) or, with `batch`, split along its first axis (a batch); unchanged in
    a one-device program.

    Without the pins XLA's sharding propagation starts from the optimizer's moments,
    split along the weights' first axis, and splits the matrix products along the
    weights too, gathering activations across devices (seen in the CPU's partitioning).
    Pinned, each device runs the forward and backward passes on its part of the batch,
    the gradients are summed across devices, and only the optimizer's update is split.
    """
    mesh = export_mesh()
    if mesh is None:
        return tree
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    where = NamedSharding(mesh, PartitionSpec(DATA_AXIS) if batch else PartitionSpec())
    return jax.lax.with_sharding_constraint(tree, where)


def on_each_device(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` of arrays split along their first axis (a batch), run on each device's
    part as a one-device computation (`jax.shard_map`) in a step exported for several
    devices; `function` itself in a one-device program. For a call that XLA cannot split
    itself but that is independent across the batch (cuDNN's attention)."""
    mesh = export_mesh()
    if mesh is None:
        return function
    import jax
    from jax.sharding import PartitionSpec

    def split(*arrays: Any) -> Any:
        specs = (PartitionSpec(DATA_AXIS),) * len(arrays)
        per_device = jax.shard_map(
            function, mesh=mesh, in_specs=specs, out_specs=PartitionSpec(DATA_AXIS)
        )
        return per_device(*arrays)

    return split
