"""The backend conformance suite. A backend package proves itself in three lines:

    class TestMyBackend(BackendConformance):
        backend_name = "mine"

It compiles the reference program (a tiny nanoGPT + AdamW train step) for the
backend's default and `compile_archs` architectures; where the device exists, runs
it and compares loss and params with JAX on the CPU, and checks that the training
state stays on the device between calls (`pcp_core.testing.transfers`: each call is
given the buffers the last one returned, and only the batch and losses cross to the
host); and checks the error for a missing device.
"""

from typing import Any, ClassVar

import pytest

from pcp_core.testing.reference import (
    BATCH,
    STEPS_PER_CALL,
    assert_matches_jax,
    initial_params,
    open_executor,
    reference,
)
from pcp_core.testing.transfers import assert_state_stays_on_device


class BackendConformance:
    backend_name: ClassVar[str]
    compile_archs: ClassVar[tuple[str, ...]] = ()  # extra architectures that must compile
    rtol: ClassVar[float] = 1e-4  # loss and params against JAX on the CPU

    @pytest.fixture
    def backend(self) -> Any:
        from pcp_core import plugins

        return plugins.host().backend(self.backend_name)

    @pytest.fixture
    def device_or_skip(self, backend: Any) -> Any:
        from pcp_core.executor import DeviceError, open_device

        try:
            return open_device(
                backend.driver, hint=backend.install_hint, runtime_flags=backend.runtime_flags
            )
        except DeviceError as error:
            pytest.skip(f"no {backend.name} device here: {error}")

    @pytest.fixture
    def compiled(self, backend: Any) -> Any:
        from pcp_core.compiler import compile_program

        return compile_program(reference()[2].stablehlo, backend, backend.resolve_arch())

    def test_registered_with_a_driver_and_target(self, backend: Any) -> None:
        assert backend.name == self.backend_name
        assert backend.target and backend.driver and backend.default_arch

    def test_compiles_reference_program(self, backend: Any, compiled: Any) -> None:
        from pcp_core.compiler import compile_program

        assert compiled.vmfb[:64] and compiled.backend == backend.name
        for arch in self.compile_archs:
            assert compile_program(reference()[2].stablehlo, backend, arch).vmfb

    def test_matches_jax_on_cpu(self, backend: Any, compiled: Any, device_or_skip: Any) -> None:
        _, config, _ = reference()
        assert_matches_jax(backend, compiled.vmfb, reference(), initial_params(config), self.rtol)

    def test_state_stays_on_device(self, backend: Any, compiled: Any, device_or_skip: Any) -> None:
        corpus, config, program = reference()
        executor = open_executor(backend, compiled.vmfb, program, initial_params(config))
        block = config["block_size"]
        batches = [corpus.batches("train", STEPS_PER_CALL, BATCH, block, (0, i)) for i in range(3)]
        assert_state_stays_on_device(executor, batches)

    def test_missing_device_is_a_clear_error(self, backend: Any) -> None:
        from pcp_core.executor import DeviceError, open_device

        with pytest.raises(DeviceError) as error:
            open_device(backend.driver, device_index=999)
        assert backend.driver in str(error.value)
        assert "Traceback" not in str(error.value) and "\n" not in str(error.value)
