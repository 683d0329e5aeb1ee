"""The backend conformance suite. A backend package proves itself in three lines:

    class TestMyBackend(BackendConformance):
        backend_name = "mine"

It builds the reference program (a tiny nanoGPT + AdamW train step) for the
backend's default and `compile_archs` architectures with the backend's runtime; where
the device exists, runs it and compares loss and params with JAX on the CPU, and checks
that the training state stays on the device between calls (the runtime's own check; for
IREE `pcp_core.iree.transfers`: each call is given the buffers the last one
returned, and only the batch and losses cross to the host); and checks the error for a
missing device; and that zeroing optimizer-state tensors (a DiLoCo worker's round start
under `--inner-momentum reset`) zeroes those alone.
"""

from typing import Any, ClassVar

import numpy as np
import pytest

from pcp_core.testing.reference import (
    BATCH,
    STEPS_PER_CALL,
    assert_matches_jax,
    initial_params,
    open_executor,
    reference,
)


class BackendConformance:
    backend_name: ClassVar[str]
    compile_archs: ClassVar[tuple[str, ...]] = ()  # extra architectures that must compile
    rtol: ClassVar[float] = 1e-4  # loss and params against JAX on the CPU

    @pytest.fixture
    def backend(self) -> Any:
        from pcp_core import plugins

        return plugins.host().backend(self.backend_name)

    @pytest.fixture
    def device_or_skip(self, backend: Any) -> None:
        from pcp_core.backends import DeviceError

        try:
            backend.runtime.require_device(backend, None)
        except DeviceError as error:
            pytest.skip(f"no {backend.name} device here: {error}")

    @pytest.fixture
    def compiled(self, backend: Any) -> Any:
        return backend.runtime.build(reference()[2], backend, backend.resolve_arch())

    def test_registered_with_a_runtime_and_default_arch(self, backend: Any) -> None:
        assert backend.name == self.backend_name
        assert backend.default_arch and backend.runtime.kind

    def test_compiles_reference_program(self, backend: Any, compiled: Any) -> None:
        assert compiled.data[:64] and compiled.backend == backend.name
        assert compiled.kind == backend.runtime.kind
        for arch in self.compile_archs:
            assert backend.runtime.build(reference()[2], backend, arch).data

    def test_matches_jax_on_cpu(self, backend: Any, compiled: Any, device_or_skip: Any) -> None:
        _, config, _ = reference()
        assert_matches_jax(backend, compiled.data, reference(), initial_params(config), self.rtol)

    def test_state_stays_on_device(self, backend: Any, compiled: Any, device_or_skip: Any) -> None:
        corpus, config, program = reference()
        executor = open_executor(backend, compiled.data, program, initial_params(config))
        block = config["block_size"]
        batches = [corpus.batches("train", STEPS_PER_CALL, BATCH, block, (0, i)) for i in range(3)]
        backend.runtime.assert_state_stays_on_device(executor, batches)

    def test_filling_optimizer_tensors_changes_them_alone(
        self, backend: Any, compiled: Any, device_or_skip: Any
    ) -> None:
        """The executor's own filling (on the device, where it has one: the momentum
        zeroed, the step counter set to a round's position, as DiLoCo's budgeted rounds
        do) leaves the state and the next call's losses and parameters as filling
        through the host does."""
        from pcp_core import plugins
        from pcp_core.backends import set_opt_tensors, set_opt_tensors_through_host
        from pcp_core.optimizers import InnerOptimizer

        corpus, config, program = reference()
        block = config["block_size"]
        batches = [corpus.batches("train", STEPS_PER_CALL, BATCH, block, (0, i)) for i in range(2)]
        adamw = plugins.host().optimizer("adamw")
        assert isinstance(adamw, InnerOptimizer)
        values = dict.fromkeys(program.opt_field_names(adamw.momentum_field), 0.0)
        values |= dict.fromkeys(program.opt_field_names(adamw.step_field), 7.0)
        assert len(values) > 1
        outcomes = []
        for fill in (set_opt_tensors, set_opt_tensors_through_host):
            executor = open_executor(backend, compiled.data, program, initial_params(config))
            executor.run(*batches[0])
            before = executor.opt_state()
            fill(executor, values)
            for spec, old, new in zip(program.opt_specs, before, executor.opt_state(), strict=True):
                if spec.name in values:
                    assert np.any(old) and np.all(new == values[spec.name]), spec.name
                else:
                    np.testing.assert_array_equal(new, old, err_msg=spec.name)
            outcomes.append((executor.run(*batches[1]), executor.params(), executor.opt_state()))
        (losses, params, state), (host_losses, host_params, host_state) = outcomes
        np.testing.assert_array_equal(losses, host_losses)
        for ours, theirs in zip([*params, *state], [*host_params, *host_state], strict=True):
            np.testing.assert_array_equal(ours, theirs)

    def test_missing_device_is_a_clear_error(self, backend: Any) -> None:
        from pcp_core.backends import DeviceError

        with pytest.raises(DeviceError) as error:
            backend.runtime.require_device(backend, 999)
        # the missing device, or the missing driver behind it, said in one line
        driver = getattr(backend.runtime, "driver", backend.name)  # IREE's, or the backend
        assert "999" in str(error.value) or driver in str(error.value)
        assert "Traceback" not in str(error.value) and "\n" not in str(error.value)
