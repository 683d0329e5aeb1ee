"""The cached sampler's step functions as IREE modules, compiled for a backend and run
on its device (`pcp export --format iree`, `pcp sample --backend`).

`prefill` and `decode` (see `pcp_core.program.decoding`) compile to one VMFB each, for
the backend's target and architecture, without its hardware and through the compile
cache, as `pcp compile` does. `IreeDecoder` loads both on the device, uploads the
parameters once, and passes the key/value cache from call to call on the device: only
the tokens in and the logits out cross to the host.
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from pcp_core.backends import Backend, CompileError
from pcp_core.iree import executor
from pcp_core.iree.compiler import compile_program
from pcp_core.models import Model, Params
from pcp_core.program import decoding
from pcp_core.program.build import ENTRY_FUNCTION
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


class IreeDecoder:
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
        self._steps = {}
        for step in decoding.STEPS:
            module = rt.VmModule.copy_buffer(self._context.instance, vmfbs[step])
            self._context.add_vm_module(module)
            self._steps[step] = self._context.modules[module.name][ENTRY_FUNCTION]
        on_device = [rt.asdevicearray(device, np.asarray(v, np.float32)) for v in params.values()]
        self._params = on_device
        self._cache = rt.asdevicearray(device, np.zeros(cache_shape, np.float32))

    def _call(self, step: str, tokens: np.ndarray, start: int, last: int) -> np.ndarray:
        args = (*self._params, self._cache, tokens, np.int32(start), np.int32(last))
        logits, self._cache = self._steps[step](*args)
        return executor.to_host(logits)

    def prefill(self, window: np.ndarray, last: int) -> np.ndarray:
        return self._call("prefill", window, 0, last)

    def decode(self, token: int, position: int) -> np.ndarray:
        return self._call("decode", np.asarray([[token]], np.int32), position, 0)
