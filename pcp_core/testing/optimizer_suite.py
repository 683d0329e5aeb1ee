"""Conformance suites for optimizers. An optimizer package proves itself in three lines:

    class TestMyOptimizer(InnerOptimizerConformance):   # or OuterOptimizerConformance
        optimizer_name = "mine"

Inner: it is registered with role "inner", builds an optax-style transformation whose
updates keep every parameter's shape and dtype, and the reference train program built
with it compiles for the CPU backend, runs there and matches JAX, and lowers the loss.
Outer: it steps float32 parameters in place, against the pseudo-gradient, and its
state survives a save and a restore (the shepherd checkpoints it).
"""

from typing import Any, ClassVar

import numpy as np
import pytest

from pcp_core.optimizers import OuterSettings
from pcp_core.testing.reference import (
    assert_matches_jax,
    initial_params,
    on_cpu,
    reference,
    reference_settings,
)


class InnerOptimizerConformance:
    optimizer_name: ClassVar[str]
    rtol: ClassVar[float] = 1e-4  # IREE on the CPU against JAX
    # parameters whose gradient is exactly zero, compared for finiteness only (see
    # pcp_core.testing.reference.assert_matches_jax): set it for sign-based updates
    unstable_params: ClassVar[tuple[str, ...]] = ()

    @pytest.fixture
    def optimizer(self) -> Any:
        from pcp_core import plugins

        return plugins.host().optimizer(self.optimizer_name)

    def test_registered_as_inner(self, optimizer: Any) -> None:
        assert optimizer.name == self.optimizer_name and optimizer.role == "inner"

    def test_updates_keep_shapes_and_dtypes(self, optimizer: Any) -> None:
        import jax.numpy as jnp

        params = {"w": jnp.ones((3, 4), jnp.float32), "b": jnp.zeros(4, jnp.float32)}
        grads = {"w": jnp.full((3, 4), 0.5, jnp.float32), "b": jnp.ones(4, jnp.float32)}
        with on_cpu():
            tx = optimizer.build(reference_settings(optimizer))
            updates, _ = tx.update(grads, tx.init(params), params)
        for name, value in params.items():
            assert updates[name].shape == value.shape and updates[name].dtype == value.dtype
            assert bool(jnp.all(jnp.isfinite(updates[name])))

    def test_trains_the_reference_model_on_the_cpu_backend(self) -> None:
        from pcp_core import plugins
        from pcp_core.iree.compiler import compile_program

        run = reference(optimizer=self.optimizer_name)
        cpu = plugins.host().backend("cpu")
        vmfb = compile_program(run[2].stablehlo, cpu, cpu.resolve_arch()).vmfb
        params = initial_params(run[1])
        losses = assert_matches_jax(cpu, vmfb, run, params, self.rtol, self.unstable_params)
        assert losses[-1] < losses[0], f"the loss did not fall: {losses}"


class OuterOptimizerConformance:
    optimizer_name: ClassVar[str]

    @pytest.fixture
    def optimizer(self) -> Any:
        from pcp_core import plugins

        return plugins.host().optimizer(self.optimizer_name)

    @staticmethod
    def params() -> list[np.ndarray]:
        return [np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), np.ones(5, np.float32)]

    @staticmethod
    def delta(scale: float) -> list[np.ndarray]:
        return [np.full((3, 4), scale, np.float32), np.full(5, -scale, np.float32)]

    def test_registered_as_outer(self, optimizer: Any) -> None:
        assert optimizer.name == self.optimizer_name and optimizer.role == "outer"

    def test_steps_in_place_against_the_pseudo_gradient(self, optimizer: Any) -> None:
        params = self.params()
        before = [p.copy() for p in params]
        ids = [id(p) for p in params]
        step = optimizer.create(OuterSettings(), params)
        delta = self.delta(0.1)
        step(params, delta)
        assert [id(p) for p in params] == ids, "the step must update the arrays in place"
        for new, old, d in zip(params, before, delta, strict=True):
            assert new.dtype == np.float32 and new.shape == old.shape
            assert np.all(np.isfinite(new))
            # the pseudo-gradient is θ_global − θ_local: a step moves against it
            assert float(np.sum((new - old) * d)) < 0

    def test_state_survives_save_and_restore(self, optimizer: Any) -> None:
        original, restored = self.params(), self.params()
        step = optimizer.create(OuterSettings(), original)
        step(original, self.delta(0.1))
        saved = {k: np.array(v, copy=True) for k, v in step.state().items()}
        restored_step = optimizer.create(OuterSettings(), restored)
        restored_step.load_state(saved)
        for target in (original, restored):
            target[:] = [p.copy() for p in self.params()]
        step(original, self.delta(0.3))
        restored_step(restored, self.delta(0.3))
        for a, b in zip(original, restored, strict=True):
            np.testing.assert_array_equal(a, b)
