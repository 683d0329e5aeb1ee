"""The cached sampler's step functions as IREE modules, compiled for a backend and run
on its device (`pcp export --format iree`, `pcp sample --backend`).

`prefill` and `decode` (see `pcp_core.program.decoding`) compile to one VMFB each, for
the backend's target and architecture, without its hardware and through the compile
cache, as `pcp compile` does. `IreeDecoder` loads both on the device, uploads the
parameters once, and passes the key/value cache from call to call on the device: only
the tokens in and the logits out cross to the host.
"""

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pcp_core.backends import Backend, CompileError
from pcp_core.iree import executor
from pcp_core.iree.compiler import compile_program
from pcp_core.models import Model, Params
from pcp_core.program import decoding
from pcp_core.program.build import ENTRY_FUNCTION
from pcp_core.program.export import beside
from pcp_core.program.trained import TrainedModel


def iree_runtime(backend: Backend) -> Any:
    """The backend's IreeRuntime; CompileError where it is not an IREE backend."""
    from pcp_core.iree.runtime import IreeRuntime

    if not isinstance(backend.runtime, IreeRuntime):
        raise CompileError(f"backend {backend.name!r} does not run IREE modules")
    return backend.runtime


def compile_steps(
    model: Model, config: Mapping[str, int], backend: Backend, arch: str
) -> dict[str, bytes]:
    """One VMFB per step function (`prefill`, `decode`) for `backend` and `arch`."""
    iree_runtime(backend)
    texts = decoding.stablehlo(model, config)
    return {step: compile_program(texts[step], backend, arch).vmfb for step in decoding.STEPS}


def decoder_for(backend: Backend, target: str | None, run: TrainedModel) -> decoding.Decoder:
    """The cached sampler's steps on `backend` (for `target`, else its detected
    architecture): IREE modules on an IREE backend's device; jax on its default device
    for a backend that is not IREE's (pcp-xla)."""
    from pcp_core.iree.runtime import IreeRuntime

    if not isinstance(backend.runtime, IreeRuntime):
        return decoding.JaxDecoder(run.model, run.config, run.params)
    _, cache_shape = decoding.check_model(run.model)
    vmfbs = compile_steps(run.model, run.config, backend, backend.resolve_arch(target))
    return IreeDecoder(vmfbs, backend, cache_shape(run.config, 1), run.params)


def module_writer(
    backend: Backend, target: str | None
) -> Callable[[TrainedModel, Path], tuple[list[Path], dict[str, Any]]]:
    """For `pcp export --format iree`: a writer of the step functions compiled for
    `backend` and `target` beside `out` (`NAME.prefill.vmfb`, `NAME.decode.vmfb`) and of
    the parameters they take (`NAME.params.safetensors`); the paths and their metadata."""
    from safetensors.numpy import save_file

    iree_runtime(backend)

    def write(run: TrainedModel, out: Path) -> tuple[list[Path], dict[str, Any]]:
        arch = backend.resolve_arch(target)
        vmfbs = compile_steps(run.model, run.config, backend, arch)
        paths = {step: beside(out, f"{step}.vmfb") for step in decoding.STEPS}
        for step, path in paths.items():
            path.write_bytes(vmfbs[step])
        params_path = beside(out, "params.safetensors")
        save_file({k: np.asarray(v, np.float32) for k, v in run.params.items()}, params_path)
        _, cache_shape = decoding.check_model(run.model)
        described = {
            "backend": backend.name,
            "target": arch,
            "driver": iree_runtime(backend).driver,
            "modules": {step: path.name for step, path in paths.items()},
            "function": ENTRY_FUNCTION,
            "arguments": "the parameters (in parameter_order), the cache (cache_shape, "
            "float32; zeros at first), tokens [1, time] int32 (time: block_size for "
            "prefill, 1 for decode), start and last (int32 scalars)",
            "results": "logits [vocab_size] float32 at row `last` of the tokens, the cache",
            "cache_shape": list(cache_shape(run.config, 1)),
            "parameters": params_path.name,
            "parameter_order": list(run.params),
        }
        return [*paths.values(), params_path], described

    return write


class IreeDecoder(decoding.StepRunner):
    """The compiled step functions on the backend's device, with the params and the
    cache kept there."""

    def __init__(
        self,
        vmfbs: Mapping[str, bytes],
        backend: Backend,
        cache_shape: tuple[int, ...],
        params: Params,
        device_index: int | None = None,
    ) -> None:
        import iree.runtime as rt

        runtime = iree_runtime(backend)
        device = executor.open_device(
            runtime.driver, device_index, backend.install_hint, runtime.runtime_flags
        )
        self._context = rt.SystemContext(config=rt.Config(device=device))
        steps = {}
        for step in decoding.STEPS:
            module = rt.VmModule.copy_buffer(self._context.instance, vmfbs[step])
            self._context.add_vm_module(module)
            steps[step] = self._context.modules[module.name][ENTRY_FUNCTION]
        on_device = [rt.asdevicearray(device, np.asarray(v, np.float32)) for v in params.values()]
        super().__init__(steps, on_device, rt.asdevicearray(device, np.zeros(cache_shape, "f4")))

    def to_host(self, logits: Any) -> np.ndarray:
        return executor.to_host(logits)
