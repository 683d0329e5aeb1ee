"""The backend suite's "training state stays on the device" check can fail.

It is proved against the core's IREE executor on the CPU, and against executors that
each break the promise in one way: they must all be caught.
"""

from typing import Any

import numpy as np
import pytest

from pcp_core.iree.executor import IreeExecutor, to_host
from pcp_core.iree.transfers import assert_state_stays_on_device, watch_transfers
from pcp_core.testing.reference import (
    BATCH,
    STEPS_PER_CALL,
    initial_params,
    on_cpu,
    reference,
)


class CopiesThroughHost(IreeExecutor):
    """Reads parameters and optimizer state back and uploads them again every run."""

    def run(self, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        self.set_params(self.params())
        self.set_opt_state(self.opt_state())
        return super().run(inputs, targets)


class CopiesThroughDeviceArrays(IreeExecutor):
    """The same round trip with iree.runtime's own DeviceArray.to_host / asdevicearray."""

    def run(self, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        import iree.runtime as rt

        losses = super().run(inputs, targets)
        self._params = [rt.asdevicearray(self.device, a.to_host()) for a in self._params]
        self._opt_state = [rt.asdevicearray(self.device, a.to_host()) for a in self._opt_state]
        return losses


class ReadsStateEveryRun(IreeExecutor):
    """Keeps the state on the device, but copies it to the host after every run."""

    def run(self, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        losses = super().run(inputs, targets)
        self.host_copy = [to_host(a) for a in self.device_state()]
        return losses


class FeedsHostArrays(IreeExecutor):
    """Hands the program host arrays, which the runtime uploads itself on each call."""

    def run(self, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        self._params = [a.to_host() for a in self._params]
        self._opt_state = [a.to_host() for a in self._opt_state]
        return super().run(inputs, targets)


@pytest.fixture(scope="module")
def cpu_reference() -> tuple[Any, Any, Any, bytes]:
    from pcp_core import plugins
    from pcp_core.iree.compiler import compile_program

    backend = plugins.host().backend("cpu")
    corpus, config, program = reference()
    vmfb = compile_program(program.stablehlo, backend, backend.resolve_arch()).vmfb
    return backend, (corpus, config), program, vmfb


def opened(kind: type[IreeExecutor], cpu_reference: tuple) -> tuple[IreeExecutor, list]:
    """An executor of `kind` with the reference state, and three batches for it."""
    backend, (corpus, config), program, vmfb = cpu_reference
    executor = kind(vmfb, backend.runtime.driver, program.param_specs, program.opt_specs)
    params = initial_params(config)
    with on_cpu():
        opt_state = program.init_opt_state(params)
    executor.set_params(params)
    executor.set_opt_state(opt_state)
    block = config["block_size"]
    batches = [corpus.batches("train", STEPS_PER_CALL, BATCH, block, (0, i)) for i in range(3)]
    return executor, batches


def test_the_core_executor_passes(cpu_reference: tuple) -> None:
    executor, batches = opened(IreeExecutor, cpu_reference)
    assert_state_stays_on_device(executor, batches)


@pytest.mark.parametrize(
    ("kind", "caught_by"),
    [
        (CopiesThroughHost, "moved"),
        (CopiesThroughDeviceArrays, "moved"),
        (ReadsStateEveryRun, "moved"),
        (FeedsHostArrays, "moved"),
    ],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_an_executor_that_moves_state_through_the_host_fails(
    cpu_reference: tuple, kind: type[IreeExecutor], caught_by: str
) -> None:
    executor, batches = opened(kind, cpu_reference)
    with pytest.raises(AssertionError, match=caught_by):
        assert_state_stays_on_device(executor, batches)


def test_copies_that_move_no_bytes_in_view_are_caught_by_identity(
    cpu_reference: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even were the byte count blind to a copy, the new buffers would give it away."""
    from pcp_core.iree import transfers

    monkeypatch.setattr(transfers, "SLACK_BYTES", 1 << 40)
    executor, batches = opened(CopiesThroughHost, cpu_reference)
    with pytest.raises(AssertionError, match=r"was not given the \S+ buffer"):
        assert_state_stays_on_device(executor, batches)


def test_the_old_check_passed_a_host_copying_executor(cpu_reference: tuple) -> None:
    """Why the check changed: `is_host_accessible` stays False on fresh copies."""
    executor, batches = opened(CopiesThroughDeviceArrays, cpu_reference)
    for inputs, targets in batches:
        executor.run(inputs, targets)
        assert not any(a.is_host_accessible for a in executor.device_state())


def test_a_run_of_the_core_executor_moves_only_its_losses(cpu_reference: tuple) -> None:
    executor, batches = opened(IreeExecutor, cpu_reference)
    with watch_transfers() as seen:
        losses = executor.run(*batches[0])
    assert seen.host_bytes == losses.nbytes and len(seen.calls) == 1


def test_zeroing_momentum_moves_nothing_through_the_host(cpu_reference: tuple) -> None:
    """A DiLoCo worker's round start under --inner-momentum reset: the device fills."""
    executor, batches = opened(IreeExecutor, cpu_reference)
    executor.run(*batches[0])
    momentum = set(cpu_reference[2].opt_field_names("mu"))
    with watch_transfers() as seen:
        executor.fill_opt_tensors(dict.fromkeys(momentum, 0.0))
    assert momentum and seen.host_bytes == 0, seen.since(0)
    assert_state_stays_on_device(executor, batches[1:])
