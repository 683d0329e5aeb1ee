"""The backend conformance suite. A backend package proves itself in three lines:

    class TestMyBackend(BackendConformance):
        backend_name = "mine"

It compiles the reference program (a tiny nanoGPT + AdamW train step) for the
backend's default and `compile_archs` architectures; where the device exists, runs
it and compares loss and params with JAX on the CPU, and checks that the training
state stays on the device between calls; and checks the error for a missing device.
"""

from functools import cache
from typing import Any, ClassVar

import numpy as np
import pytest

REFERENCE_MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16}
STEPS_PER_CALL, BATCH, CALLS = 2, 4, 3


def on_cpu() -> Any:
    """JAX runs the reference on the CPU, also on a machine whose default is a GPU."""
    import jax

    return jax.default_device(jax.devices("cpu")[0])


@cache
def reference() -> tuple[Any, Any, Any]:
    """The corpus, model config and train program every backend is checked with."""
    from pcp_core import data, nanogpt, plugins
    from pcp_core.optimizers import InnerSettings
    from pcp_core.program import build_train_program

    corpus = data.load_text_file(None)
    config = nanogpt.MODEL.config({**REFERENCE_MODEL, "vocab_size": corpus.vocab_size})
    adamw = plugins.host().optimizer("adamw")
    # eps 1e-6, not 1e-8: the attention key bias has an exactly-zero gradient, and a tiny
    # eps would let Adam turn each backend's rounding noise there into real updates.
    settings = InnerSettings(lr=3e-3, warmup_steps=1, total_steps=STEPS_PER_CALL * CALLS, eps=1e-6)
    tx = adamw.build(settings)
    with on_cpu():
        program = build_train_program(nanogpt.MODEL, config, tx, STEPS_PER_CALL, BATCH)
    return corpus, config, program


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

    def _executor(self, backend: Any, compiled: Any) -> tuple[Any, list[np.ndarray], list]:
        from pcp_core import nanogpt
        from pcp_core.executor import IreeExecutor

        _, config, program = reference()
        executor = IreeExecutor(
            compiled.vmfb,
            backend.driver,
            program.param_specs,
            program.opt_specs,
            runtime_flags=backend.runtime_flags,
        )
        params = list(nanogpt.init(config, seed=0).values())
        with on_cpu():
            opt_state = program.init_opt_state(params)
        executor.set_params(params)
        executor.set_opt_state(opt_state)
        return executor, params, opt_state

    def test_matches_jax_on_cpu(self, backend: Any, compiled: Any, device_or_skip: Any) -> None:
        corpus, config, program = reference()
        executor, params, opt_state = self._executor(backend, compiled)
        jax_params, jax_opt = tuple(params), tuple(opt_state)
        for call in range(CALLS):
            x, y = corpus.batches("train", STEPS_PER_CALL, BATCH, config["block_size"], (0, call))
            losses = executor.run(x, y)
            with on_cpu():
                jax_params, jax_opt, jax_losses = program.jax_step(jax_params, jax_opt, x, y)
            np.testing.assert_allclose(losses, np.asarray(jax_losses), rtol=self.rtol)
        for spec, ours, theirs in zip(
            program.param_specs, executor.params(), jax_params, strict=True
        ):
            theirs = np.asarray(theirs)
            error = np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-12)
            assert error < self.rtol, f"{spec.name}: relative error {error:.2e}"

    def test_state_stays_on_device(self, backend: Any, compiled: Any, device_or_skip: Any) -> None:
        corpus, config, _ = reference()
        executor, _, _ = self._executor(backend, compiled)
        for call in range(2):
            x, y = corpus.batches("train", STEPS_PER_CALL, BATCH, config["block_size"], (0, call))
            executor.run(x, y)
            state = executor.device_state()
            assert all(type(a).__name__ == "DeviceArray" for a in state)
            assert not any(a.is_host_accessible for a in state), "state was copied to the host"

    def test_missing_device_is_a_clear_error(self, backend: Any) -> None:
        from pcp_core.executor import DeviceError, open_device

        with pytest.raises(DeviceError) as error:
            open_device(backend.driver, device_index=999)
        assert backend.driver in str(error.value)
        assert "Traceback" not in str(error.value) and "\n" not in str(error.value)
