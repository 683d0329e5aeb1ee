"""Validation on a backend's device: the eval program, built and loaded on first use.

The eval program (`pcp_core.program.build.build_eval_program`) is shaped like a train
program, so any backend's runtime builds and runs it the way it runs training; the
validation loss is computed where the run computes, not in JAX on the host.
"""

from collections.abc import Callable
from typing import Any

import numpy as np
import structlog

from pcp_core.backends import Backend, Executor
from pcp_core.program.build import TrainProgram

log = structlog.get_logger(__name__)


class Evaluator:
    """The mean loss of the eval program's batches, on device `device` of `backend`.

    `build` exports the eval program; it is called on the first evaluation, so a run
    that never evaluates never traces or compiles it.
    """

    def __init__(
        self, build: Callable[[], TrainProgram], backend: Backend, arch: str, device: int | None
    ) -> None:
        self.build, self.backend, self.arch, self.device = build, backend, arch, device
        self._executor: Executor | None = None

    def load(self) -> Executor:
        """Build and load the eval program now (the first evaluation does it otherwise):
        a training loop calls this before its first step, so no compile lands inside it.
        A DeviceError comes before the build if the device is not here."""
        if self._executor is None:
            self.backend.runtime.require_device(self.backend, self.device)
            program, runtime = self.build(), self.backend.runtime
            artifact = runtime.build(program, self.backend, self.arch)
            self._executor = runtime.open(artifact.data, self.backend, program, self.device)
            self._executor.set_opt_state([])
            log.info("evaluating on", backend=self.backend.name, arch=self.arch)
        return self._executor

    def loss(self, params: list[Any], inputs: np.ndarray, targets: np.ndarray) -> float:
        """`params`: host arrays, or what the training executor's `params_snapshot` gave
        (the eval executor is of the same backend, so it takes them where they are)."""
        return float(np.mean(self.losses(params, inputs, targets)))

    def losses(self, params: list[Any], inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """The loss of each batch, in float64."""
        executor = self.load()
        executor.set_params(params)
        return np.asarray(executor.run(inputs, targets), np.float64)
