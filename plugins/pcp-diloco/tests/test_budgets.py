"""Rounds by time (`--round-budget`) and the merge that weighs what each worker did
(`--merge`): the budget learnt from the reports, a worker's round that fits its budget
and follows the run's schedule, the weighted mean, and a run on loopback."""

import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from pcp_diloco import worker_side
from pcp_diloco.budgets import MEASURING_S, RoundBudget, aligned, weigh_by
from pcp_diloco.settings import DilocoWorkerSettings, budget_seconds

from pcp_core import config_file, plugins, run
from pcp_core.config import ConfigError, RunConfig
from pcp_core.config_file import declared_settings
from pcp_core.program.build import TensorSpec
from pcp_core.shepherd.aggregation import RunningSum
from pcp_core.wire.messages import BUDGET_STEPS_FACTOR, Assignment, Result, Tensor
from pcp_core.worker.session import WorkerSession


def result(steps: int, compute_s: float) -> Result:
    return Result(0, 0, [1.0] * steps, compute_s, 1.0)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("steps", 0.0), ("auto", -1.0), ("30s", 30.0), ("0.5s", 0.5), ("30", None), ("0s", None),
     ("-5s", None), ("infs", None), ("nans", None), ("fast", None), ("", None)],
)  # fmt: skip
def test_a_round_budget_is_steps_auto_or_a_positive_duration(value: str, seconds) -> None:
    assert budget_seconds(value) == seconds


def test_a_bad_round_budget_is_refused_with_what_it_may_be() -> None:
    flags = {"algorithm": "diloco", "round_budget": "30"}
    with pytest.raises(ConfigError, match=r"round_budget.*steps, auto or a duration"):
        config_file.resolve(None, flags, declared=declared_settings(plugins.host()))


def test_auto_measures_first_then_gives_the_fastest_worker_h_steps_of_time() -> None:
    budget = RoundBudget("auto", round_steps=20, steps_per_call=1)
    assert budget.measuring() and budget.seconds() == MEASURING_S
    budget.learn({0: result(2, 1.0), 1: result(2, 0.4)})  # one call each, warming up
    assert not budget.measuring()
    # one warming-up call is no measure of H steps: the next round is the slowest's call
    assert budget.seconds() == pytest.approx(1.0)  # its 0.5 s, or ROUGH_MIN_S
    # the first full round replaces the rough measure, later ones are averaged in
    budget.learn({0: result(10, 1.0), 1: result(40, 2.0)})
    assert budget.seconds() == pytest.approx(20 * 0.05)
    budget.learn({0: result(10, 1.0), 1: result(20, 2.0)})  # worker 1 slowed down
    assert budget.seconds() == pytest.approx(20 * 0.075)
    # a worker absent from a round is forgotten: the rounds follow those still here
    budget.learn({0: result(10, 1.0)})
    assert budget.seconds() == pytest.approx(20 * 0.1)


def test_the_budget_is_moved_to_where_every_workers_whole_calls_end_together() -> None:
    # calls of 0.1, 0.2 and 0.4 s: at 2.1 s the two slower ones would stop at 2.0 s
    assert aligned(2.1, [0.1, 0.2, 0.4]) == pytest.approx(2.0)
    assert aligned(2.0, [0.7, 0.1]) == pytest.approx(2.1)  # 3 slow calls, 21 fast ones
    assert aligned(1.0, [0.1]) == pytest.approx(1.0)
    assert aligned(1.0, [5.0]) == pytest.approx(1.0)  # no multiple near: as it was
    # a CPU's call of 1.6 s beside a GPU's of 0.024 s and a round of 2.4 s: at 2.4 s the
    # CPU would run two calls (3.2 s) while the GPU idled; its two calls are the round
    assert aligned(2.4, [0.024, 1.6]) == pytest.approx(3.2)
    budget = RoundBudget("auto", round_steps=20, steps_per_call=2)
    budget.learn({0: result(2, 1.0)})
    budget.learn({0: result(10, 1.0), 1: result(10, 3.75)})  # calls of 0.2 and 0.75 s
    # H steps of the fastest, 2.0 s, would end the slow worker at 2.25 s: 2.2 s ends the
    # fast one at 2.2 s, the slow one at 2.25 s
    assert budget.seconds() == pytest.approx(2.2)


def test_a_round_is_never_shorter_than_the_slowest_workers_one_call() -> None:
    # a CPU worker beside a GPU one: its one call of 10 steps (4 s) is longer than the
    # GPU's H steps (100 x 0.01 s); a 1 s round would end for the GPU while it computed
    budget = RoundBudget("auto", round_steps=100, steps_per_call=10)
    budget.learn({0: result(10, 0.1), 1: result(10, 4.0)})
    budget.learn({0: result(100, 1.0), 1: result(10, 4.0)})
    assert budget.seconds() == pytest.approx(4.0)


def test_steps_and_a_duration_do_not_depend_on_the_reports() -> None:
    for setting, seconds in (("steps", 0.0), ("12s", 12.0)):
        budget = RoundBudget(setting, round_steps=20, steps_per_call=1)
        budget.learn({0: result(5, 1.0)})
        assert budget.seconds() == seconds and not budget.measuring()


def test_tokens_weigh_a_result_by_its_steps_and_mean_counts_each_once() -> None:
    assert weigh_by("tokens")(result(12, 1.0)) == 12
    assert weigh_by("mean")(result(12, 1.0)) == 1
    sums = [np.zeros(3, np.float64)]
    total = RunningSum(sums)
    total.add([np.full(3, 1.0, np.float32)], weight=3)
    total.add([np.full(3, 5.0, np.float32)], weight=1)
    mean = [np.zeros(3, np.float32)]
    total.mean_into(mean)
    np.testing.assert_array_equal(mean[0], 2.0)  # (3 x 1 + 5) / 4
    with pytest.raises(ValueError, match="positive integer"):
        total.add([np.ones(3, np.float32)], weight=0)


class TimedSteps:
    """An executor whose calls take `call_s` seconds of a fake clock, one step each,
    with an optimizer state holding a step counter."""

    def __init__(self, clock: list[float], call_s: float) -> None:
        self.clock, self.call_s = clock, call_s
        self.param_specs = [TensorSpec("p", (2,), "float32")]
        self.opt_specs = [
            TensorSpec("opt.count", (), "int32"),
            TensorSpec("opt.mu['p']", (2,), "float32"),
        ]
        self.state = [np.array(0, np.int32), np.ones(2, np.float32)]
        self._params = np.zeros(2, np.float32)

    def params(self) -> list[np.ndarray]:
        return [self._params.copy()]

    def set_params(self, params: list[np.ndarray]) -> None:
        self._params = np.array(params[0], np.float32)

    def opt_state(self) -> list[np.ndarray]:
        return [s.copy() for s in self.state]

    def set_opt_state(self, state: list[np.ndarray]) -> None:
        self.state = [np.array(s) for s in state]

    def run(self, inputs: object, targets: object) -> list[float]:
        self.clock[0] += self.call_s
        self._params -= 1
        self.state[0] += 1
        return [0.5]


class QueuedSteps(TimedSteps):
    """TimedSteps on an asynchronous device (`dispatch`, as XLA's on a GPU): a call is
    queued at once and the host's clock moves when it waits for the losses."""

    def __init__(self, clock: list[float], call_s: float) -> None:
        super().__init__(clock, call_s)
        self.events: list[tuple[str, int]] = []

    def dispatch(self, inputs: object, targets: object):
        call = sum(event == "queued" for event, _ in self.events)
        self.events.append(("queued", call))
        self._params -= 1
        self.state[0] += 1

        def wait() -> np.ndarray:
            self.events.append(("waited", call))
            self.clock[0] += self.call_s
            return np.array([0.5])

        return wait


def budgeted_session(
    call_s: float, monkeypatch: pytest.MonkeyPatch, device: type = TimedSteps
) -> WorkerSession:
    clock = [0.0]
    monkeypatch.setattr(worker_side.time, "perf_counter", lambda: clock[0])
    corpus = SimpleNamespace(batches=lambda *args, **kwargs: (None, None))
    told = DilocoWorkerSettings(fragments=1, schedule_counters=("opt.count",))
    settings = SimpleNamespace(algorithm="diloco", plugins={"diloco": told}, steps_per_call=1,
                               batch_size=1, block_size=1, manifest=None)  # fmt: skip
    return WorkerSession(0, device(clock, call_s), corpus, settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("budget_s", "call_s", "steps"),
    [(1.0, 0.1, 10), (1.0, 0.45, 2), (1.0, 0.3, 3), (1e-3, 0.1, 1), (0.0, 0.1, 20),
     (100.0, 0.1, 20 * BUDGET_STEPS_FACTOR)],
)  # fmt: skip
def test_a_budgeted_round_runs_the_calls_that_fit(
    budget_s: float, call_s: float, steps: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = budgeted_session(call_s, monkeypatch)
    params = [Tensor("p", np.zeros(2, np.float32))]
    work = worker_side.worker_round(worker, Assignment(3, 20, 0, 1, 0, params, budget_s=budget_s))
    assert len(work.losses) == steps
    np.testing.assert_array_equal(work.tensors[0].array, steps)  # anchor - params
    # a budgeted round's schedule starts at the run's position, round 3 of 20 steps
    start = 3 * 20 if budget_s > 0 else 0
    assert int(worker.executor.state[0]) == start + steps
    np.testing.assert_array_equal(worker.executor.state[1], 1)  # the rest as it was


@pytest.mark.parametrize("budget_s", [0.0, 1.0])
def test_an_asynchronous_device_has_its_next_call_before_the_host_waits_for_the_last(
    budget_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = budgeted_session(0.1, monkeypatch, QueuedSteps)
    params = [Tensor("p", np.zeros(2, np.float32))]
    work = worker_side.worker_round(worker, Assignment(3, 20, 0, 1, 0, params, budget_s=budget_s))
    steps = len(work.losses)
    # a budget of 1 s ends within a call of 10 (the one queued while the host measured)
    assert steps == 20 if budget_s == 0 else steps in (10, 11)
    np.testing.assert_array_equal(work.tensors[0].array, steps)
    assert int(worker.executor.state[0]) == (60 if budget_s else 0) + steps
    events = worker.executor.events
    assert events[:3] == [("queued", 0), ("queued", 1), ("waited", 0)]
    for call in range(steps - 1):  # each call waited for after the next one was queued
        assert events.index(("queued", call + 1)) < events.index(("waited", call))
    assert events[-1] == ("waited", steps - 1)  # and the last one before the round ends


def test_a_budgeted_round_starts_its_schedule_where_the_shepherd_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = budgeted_session(0.1, monkeypatch)
    params = [Tensor("p", np.zeros(2, np.float32))]
    given = Assignment(3, 20, 0, 1, 0, params, budget_s=1.0, schedule_step=77)
    work = worker_side.worker_round(worker, given)
    assert int(worker.executor.state[0]) == 77 + len(work.losses)


def test_a_speculative_round_takes_the_schedule_of_the_assignment_that_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = budgeted_session(0.1, monkeypatch)
    params = [Tensor("p", np.zeros(2, np.float32))]
    worker_side.worker_round(worker, Assignment(3, 20, 0, 1, 0, params, budget_s=1.0))
    coming = [Assignment(4, 20, 0, 1, 0, params, budget_s=1.0, schedule_step=500)]
    worker.arrived = lambda wait: coming.pop() if coming else None  # type: ignore[method-assign]
    guessed = Assignment(4, 20, 0, 1, 0, budget_s=1.0, schedule_step=80)  # no tensors
    work = worker_side.worker_round(worker, guessed)
    assert not coming and int(worker.executor.state[0]) == 500 + len(work.losses)


MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32, "batch_size": 8}


@pytest.mark.slow
def test_a_run_with_auto_budgets_trains_and_records_each_workers_steps(tmp_path: Path) -> None:
    config = RunConfig(
        algorithm="diloco",
        steps=120,
        eval_every=120,
        out=tmp_path,
        plugins={"diloco": {"inner_steps": 20, "round_budget": "auto"}, "shepherd": {"workers": 2}},
        **MODEL,
    )
    summary = run.train(config, dashboard=False)
    rounds = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    rounds = [r for r in rounds if "round" in r]
    assert rounds[0]["budget_s"] == MEASURING_S
    assert all(steps == 10 for steps in rounds[0]["worker_steps"].values())  # one call each
    assert all(r["budget_s"] > MEASURING_S for r in rounds[1:])
    steps = sum(sum(r["worker_steps"].values()) for r in rounds)
    assert summary["tokens"] == steps * 8 * 32
    # the schedule follows the leading worker's steps, and the run ends when a round of H
    # steps no longer fits in --steps
    leading = list(itertools.accumulate(max(r["worker_steps"].values()) for r in rounds))
    assert [r["step"] for r in rounds] == leading
    assert leading[-1] > 120 - 20 and leading[-2] <= 120 - 20
    assert "val_loss" in rounds[-1] and summary["rounds"] == len(rounds)
    assert set(summary["worker_utilisation"]) == {"0", "1"}
    assert summary["final_val_loss"] < 0.8 * summary["unigram_entropy"]
