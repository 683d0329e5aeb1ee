"""The XLA step on a worker: the deserialized `jax.export` artifact compiled for the
worker's devices, holding the parameters and optimizer state there between calls.

The step is `jax.jit(exported.call)` with the parameters and optimizer state donated,
so each call writes the new state over the old on the device and only the losses come
back. On several devices each tensor is placed as the program says
(`TrainProgram.export`): the batch split, the parameters whole on each device, the
optimizer state split.
"""

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from pcp_core import compile_cache
from pcp_core.backends import DeviceChoice, DeviceError, device_indices
from pcp_core.program.build import TensorSpec, conforming
from pcp_core.program.mesh import data_mesh

log = structlog.get_logger(__name__)

# XLA compiler options (DebugOptions fields by name) for the step a worker compiles on
# each platform. On CUDA, xla_allow_excess_precision=False: XLA otherwise drops the
# program's bf16 round trips and keeps float32 copies instead (the MLP's pre-activation
# kept for the backward pass, in float32), so it computes what the program says, as IREE
# does, in less time and memory (docs/gpu.md); the conformance suite passes with it.
COMPILER_OPTIONS: dict[str, dict[str, Any]] = {"cuda": {"xla_allow_excess_precision": False}}


@functools.cache
def keep_compiled_steps() -> Path | None:
    """Keep XLA's executables in jax's persistent compilation cache, `xla/` in PCP's
    compile cache, so that a worker that joins again with the same program (restarted by
    its supervisor, or in the next run) loads the compiled step instead of compiling it:
    XLA takes seconds to a minute for it on a GPU, autotuning included (jax keeps XLA's
    autotuning results there too). The setting is jax's, for the whole process: the
    shepherd's evaluation and the benchmarks keep their compiles as well. jax runs what
    that cache holds as code, so it is used only where PCP's compile cache is private
    (`private_cache_dir`), and a directory the user gave jax themselves stands. Returns
    PCP's compile cache where the steps are kept there, for `compile_cache.trim`."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if jax.config.jax_compilation_cache_dir:  # type: ignore[attr-defined]  # made at runtime
        return None
    directory = compile_cache.private_cache_dir()
    if directory is None:
        return None
    xla = directory / compile_cache.XLA_DIRECTORY
    try:
        xla.mkdir(mode=0o700, exist_ok=True)
    except OSError as error:
        log.warning("compiled steps not kept; compiling each time", reason=str(error))
        return None
    reason = compile_cache.unsafe_cache_dir_reason(xla)  # a link reads as no folder
    if reason:
        log.warning("compiled steps not kept; compiling each time", path=str(xla), reason=reason)
        return None
    compilation_cache.set_cache_dir(str(xla))
    return directory


class XlaExecutor:
    """A deserialized step on one jax device or a mesh of several, holding the training
    state there, each tensor placed as the program says (`TrainProgram.export`)."""

    def __init__(
        self,
        artifact: bytes,
        param_specs: list[TensorSpec],
        opt_specs: list[TensorSpec],
        device: DeviceChoice = None,
    ) -> None:
        import jax

        exported = jax.export.deserialize(bytearray(artifact))
        here = jax.export.default_export_platform()
        if here not in exported.platforms:
            raise DeviceError(
                f"this program was built for {', '.join(exported.platforms)}, "
                f"but this jaxlib runs on {here}: leave --target out, or set it to {here}"
            )
        indices = device_indices(device)
        if exported.nr_devices != len(indices):
            raise DeviceError(
                f"this program was built for {exported.nr_devices} device(s), "
                f"not the {len(indices)} this worker drives"
            )
        self.devices = [jax.devices()[i] for i in indices]
        self.param_specs, self.opt_specs = param_specs, opt_specs
        # the inputs, flat: every parameter and optimizer tensor, then inputs and targets
        placed = _placements(exported, self.devices)
        self._param_placed = placed[: len(param_specs)]
        # where params_snapshot puts its copy: host memory the device's copy engine
        # writes to by itself, on one device (on several, each would send its replica)
        pinned = len(self.devices) == 1 and any(
            m.kind == "pinned_host" for m in self.devices[0].addressable_memories()
        )
        self._snapshot_placed = [
            p.with_memory_kind("pinned_host") if pinned else p for p in self._param_placed
        ]
        self._opt_placed = placed[len(param_specs) : len(param_specs) + len(opt_specs)]
        self._batch_placed = placed[-1]
        # Compiled now, while the worker loads (XLA takes seconds to a minute, autotuning
        # on a GPU), not in its first round, where the round's deadline is counting.
        avals = [
            jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
            for a, sharding in zip(exported.in_avals, placed, strict=True)
        ]
        args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, avals)
        step = jax.jit(exported.call, donate_argnums=(0, 1))
        kept_in = keep_compiled_steps()
        self._step = step.lower(*args, **kwargs).compile(COMPILER_OPTIONS.get(here) or None)
        if kept_in is not None:
            compile_cache.trim(kept_in)
        self._params: tuple[Any, ...] | None = None
        self._opt_state: tuple[Any, ...] | None = None

    def _upload(
        self, arrays: list[Any], specs: list[TensorSpec], placements: list[Any]
    ) -> tuple[Any, ...]:
        import jax

        if len(arrays) == len(specs) and all(
            _conforms(a, s) for a, s in zip(arrays, specs, strict=True)
        ):
            # jax arrays (a params_snapshot, in host or device memory): put on the device
            # by jax, not through numpy, and copied, since each call donates what it is given
            return tuple(
                jax.device_put(a, placed, may_alias=False)
                for a, placed in zip(arrays, placements, strict=True)
            )
        # copied, so the device array owns its memory (on the CPU it would share numpy's)
        return tuple(
            jax.device_put(a.copy(), placed)
            for a, placed in zip(conforming(arrays, specs), placements, strict=True)
        )

    def holds_its_state(self) -> bool:
        """Whether every parameter and optimizer tensor is a live jax array placed as the
        program takes it (on this executor's devices)."""
        return all(
            _held(array, spec, placed)
            for arrays, specs, placements in (
                (self._params or (), self.param_specs, self._param_placed),
                (self._opt_state or (), self.opt_specs, self._opt_placed),
            )
            for array, spec, placed in zip(arrays, specs, placements, strict=True)
        )

    def set_params(self, params: list[np.ndarray]) -> None:
        """Replace the parameters on the device (the optimizer state stays)."""
        self._params = self._upload(params, self.param_specs, self._param_placed)

    def set_opt_state(self, opt_state: list[np.ndarray]) -> None:
        self._opt_state = self._upload(opt_state, self.opt_specs, self._opt_placed)

    def fill_opt_tensors(self, values: dict[str, float]) -> None:
        """Fill the named optimizer-state tensors with a value each, made on the device."""
        import jax.numpy as jnp

        if self._opt_state is None:
            raise RuntimeError("set_opt_state must come before fill_opt_tensors")
        self._opt_state = tuple(
            jnp.full(state.shape, values[spec.name], state.dtype, device=placed)
            if spec.name in values
            else state
            for spec, state, placed in zip(
                self.opt_specs, self._opt_state, self._opt_placed, strict=True
            )
        )

    def run(self, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """K inner steps over [K, batch, block] token stacks; returns the K losses."""
        return self.dispatch(inputs, targets)()

    def dispatch(self, inputs: np.ndarray, targets: np.ndarray) -> Callable[[], np.ndarray]:
        """`run` without waiting: the call is queued on the device, and the returned
        function waits for its losses (`pcp_core.backends.dispatch`). Later calls and
        folds queue behind it, as they take the state it returns."""
        import jax

        if self._params is None or self._opt_state is None:
            raise RuntimeError("set_params and set_opt_state must come before run")
        batch = [
            jax.device_put(np.asarray(b, np.int32), self._batch_placed) for b in (inputs, targets)
        ]
        self._params, self._opt_state, losses = self._step(self._params, self._opt_state, *batch)
        return lambda: np.asarray(losses)

    def device_state(self) -> list[Any]:
        """The device-resident parameter and optimizer arrays (for inspection)."""
        return [*(self._params or ()), *(self._opt_state or ())]

    def params(self) -> list[np.ndarray]:
        return [np.asarray(a) for a in self._params or ()]

    def params_snapshot(self) -> list[Any]:
        """A copy of the parameters that the next call's donation leaves alone, in pinned
        host memory where the device has it: the copy engine writes it there while the
        device goes on, an evaluation puts it back on the device the same way, and a
        checkpoint's `np.asarray` reads host memory. Read to numpy from the device
        instead, the parameters would come through pageable memory at a fraction of the
        link's speed, holding the interpreter, while the loop waits to start its next
        call (docs/gpu.md measures the loop)."""
        import jax

        params = list(self._params or ())
        return list(jax.device_put(params, self._snapshot_placed, may_alias=False))

    def opt_state(self) -> list[np.ndarray]:
        """Host copies: a worker writes them to disk while the next call runs, and on
        the CPU `np.asarray` would be a view of what that call's donation writes over."""
        return [np.array(a, copy=True) for a in self._opt_state or ()]


def _placements(exported: Any, devices: list[Any]) -> list[Any]:
    """Where each input of `exported` goes: on one device, there; on several, as the
    program's shardings say, over a mesh of `devices`."""
    import jax

    if len(devices) == 1:
        return [jax.sharding.SingleDeviceSharding(devices[0])] * len(exported.in_avals)
    return list(exported.in_shardings_jax(data_mesh(devices)))


def _conforms(array: Any, spec: TensorSpec) -> bool:
    """Whether `array` is a live jax array of `spec`'s shape and dtype, wherever it is."""
    import jax

    return (
        isinstance(array, jax.Array)
        and not array.is_deleted()
        and array.shape == tuple(spec.shape)
        and array.dtype == np.dtype(spec.dtype)
    )


def _held(array: Any, spec: TensorSpec, placed: Any) -> bool:
    """Whether `array` conforms to `spec` and is placed as `placed`."""
    return _conforms(array, spec) and array.sharding.is_equivalent_to(placed, array.ndim)
