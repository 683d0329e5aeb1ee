"""The outer-step guard: implausible steps are found, undone exactly, and blamed on the
result that stands out."""

import numpy as np

from pcp_core.parallel import delta_norm
from pcp_core.shepherd.step_guard import FIRST_STEP_RATIO, STEP_RATIO, StepGuard, outliers


class Momentum:
    """An outer step with state, as Nesterov has."""

    def __init__(self, params: list[np.ndarray]) -> None:
        self.buffers = [np.zeros_like(p) for p in params]

    def __call__(self, params: list[np.ndarray], delta: list[np.ndarray]) -> None:
        for theta, d, b in zip(params, delta, self.buffers, strict=True):
            b += d
            theta -= d + b

    def state(self) -> dict[str, np.ndarray]:
        return {f"b.{i}": b for i, b in enumerate(self.buffers)}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        for i, b in enumerate(self.buffers):
            b[...] = state[f"b.{i}"]


def params() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((8, 4)).astype(np.float32), np.ones(4, np.float32)]


def stepped(guard: StepGuard, theta: list[np.ndarray], step: Momentum, scale: float) -> str | None:
    guard.keep(theta, step.state())
    step(theta, [np.full_like(p, scale) for p in theta])
    return guard.judge(theta)


def test_a_first_step_is_judged_against_the_parameters_norm() -> None:
    theta = params()
    norm = delta_norm(theta)
    guard, step = StepGuard(theta), Momentum(theta)
    honest = 0.5 * norm / np.sqrt(36)  # a step of about the parameters' own norm
    assert stepped(guard, theta, step, honest) is None
    guard, theta, step = StepGuard(params()), params(), Momentum(params())
    huge = FIRST_STEP_RATIO * norm  # per entry: far over 100x the norm in all
    problem = stepped(guard, theta, step, huge)
    assert problem is not None and "parameters' norm" in problem


def test_later_steps_are_judged_against_earlier_ones_and_undone_exactly() -> None:
    theta, before = params(), params()
    guard, step = StepGuard(theta), Momentum(theta)
    for _ in range(3):
        assert stepped(guard, theta, step, 0.01) is None
    kept = [p.copy() for p in theta]
    kept_state = {k: v.copy() for k, v in step.state().items()}
    problem = stepped(guard, theta, step, 0.01 * 3 * STEP_RATIO)
    assert problem is not None and "median of the last steps" in problem
    guard.restore(theta, step)
    for now, then in zip(theta, kept, strict=True):
        np.testing.assert_array_equal(now, then)
    for name, value in step.state().items():
        np.testing.assert_array_equal(value, kept_state[name])
    assert not np.array_equal(theta[0], before[0])


def test_non_finite_parameters_are_refused() -> None:
    theta = params()
    guard, step = StepGuard(theta), Momentum(theta)
    problem = stepped(guard, theta, step, np.inf)
    assert problem == "the outer step made the global parameters non-finite"


def test_outliers_are_those_far_above_the_others() -> None:
    assert outliers({"a": 1.0, "b": 1.2, "evil": 1e33}) == ["evil"]
    assert outliers({"a": 1.0, "evil": 1e3}) == ["evil"]
    assert outliers({"a": 1.0, "b": 2.0}) == []
    assert outliers({"alone": 1e33}) == []
