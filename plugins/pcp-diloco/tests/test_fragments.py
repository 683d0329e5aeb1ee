"""Streaming fragments (`--fragments P`): the split, a worker's rounds over fragments, and
a run whose rounds each move 1/P of the model."""

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from pcp_diloco import worker_side
from pcp_diloco.fragments import of_round, split
from pcp_diloco.settings import DilocoWorkerSettings
from pcp_diloco.worker_side import worker_round

from pcp_core import run
from pcp_core.config import RunConfig
from pcp_core.program.build import TensorSpec
from pcp_core.wire.messages import Assignment, Tensor, WorkerSettings
from pcp_core.wire.transport import TransportError
from pcp_core.worker.joining import decode_settings
from pcp_core.worker.session import WorkerSession


def test_fragments_are_balanced_and_hold_every_tensor_once() -> None:
    sizes = [100, 10, 60, 40, 30, 30, 20, 10]
    groups = split(sizes, 3)
    assert sorted(i for group in groups for i in group) == list(range(len(sizes)))
    weights = [sum(sizes[i] for i in group) for group in groups]
    assert max(weights) - min(weights) <= 10, weights
    assert split(sizes, 1) == [tuple(range(len(sizes)))]
    assert split(sizes, 3) == groups  # both sides compute it: it must not vary
    assert [of_round(r, 3) for r in range(5)] == [0, 1, 2, 0, 1]


def test_a_tensor_larger_than_a_share_is_a_fragment_of_its_own() -> None:
    assert split([1000, 1, 1, 1], 2) == [(0,), (1, 2, 3)]


@pytest.mark.parametrize("count", [0, 5])
def test_more_fragments_than_tensors_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match="from 1 to the model's 4 parameter tensors"):
        split([1, 2, 3, 4], count)


class OneStepDown:
    """An executor whose every step lowers each parameter by 1."""

    def __init__(self, sizes: list[int]) -> None:
        self.param_specs = [TensorSpec(f"p{i}", (n,), "float32") for i, n in enumerate(sizes)]
        self._params = [np.zeros(n, np.float32) for n in sizes]

    def params(self) -> list[np.ndarray]:
        return [p.copy() for p in self._params]

    def set_params(self, params: list[np.ndarray]) -> None:
        self._params = [np.array(p, np.float32) for p in params]

    def run(self, inputs: object, targets: object) -> list[float]:
        self._params = [p - 1 for p in self._params]
        return [0.0]


def session(fragments: int, arrived: object = None) -> WorkerSession:
    corpus = SimpleNamespace(batches=lambda *args, **kwargs: (None, None))
    settings = SimpleNamespace(
        algorithm="diloco",
        plugins={"diloco": DilocoWorkerSettings(fragments=fragments)},
        steps_per_call=1,
        batch_size=1,
        block_size=1,
        manifest=None,
    )
    made = WorkerSession(0, OneStepDown([4, 3, 1]), corpus, settings)  # type: ignore[arg-type]
    if arrived is not None:
        made.arrived = arrived  # type: ignore[assignment]
    return made


def tensors(values: dict[int, float]) -> list[Tensor]:
    sizes = [4, 3, 1]
    return [Tensor(f"p{i}", np.full(sizes[i], v, np.float32)) for i, v in values.items()]


def test_a_worker_returns_one_fragment_a_round_and_keeps_the_others_progress() -> None:
    worker = session(fragments=2)  # split([4, 3, 1], 2): p0 | p1 p2
    first = worker_round(worker, Assignment(0, 3, 0, 1, 0, tensors({0: 10, 1: 20, 2: 30})))
    assert [t.name for t in first.tensors] == ["p0"]
    np.testing.assert_array_equal(first.tensors[0].array, 3)  # three steps of 1 down
    # round 1 refreshes p0 alone; p1 and p2 go on from where round 0 left them
    second = worker_round(worker, Assignment(1, 3, 0, 1, 0, tensors({0: 7})))
    assert [t.name for t in second.tensors] == ["p1", "p2"]
    np.testing.assert_array_equal(second.tensors[0].array, 6)  # six steps since it was given
    np.testing.assert_array_equal(worker.executor.params()[0], 4)  # 7, then 3 steps


def test_rounds_read_the_settings_the_worker_decoded_at_its_join(
    pcp_host: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    told = DilocoWorkerSettings((), 2, ("opt.count",))
    sent = WorkerSettings("diloco", "run", 3, {"diloco": told}, steps_per_call=1).to_json()
    # on the wire, the form it always had
    expected = {"zero_at_round_start": [], "fragments": 2, "schedule_counters": ["opt.count"]}
    assert json.loads(sent)["plugins"] == {"diloco": expected}
    settings = decode_settings(sent, pcp_host)
    assert settings.plugins["diloco"] == told  # its tuples tuples again
    corpus = SimpleNamespace(batches=lambda *args, **kwargs: (None, None))
    worker = WorkerSession(0, OneStepDown([4, 3, 1]), corpus, settings)

    def rebuilt(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a round rebuilt the settings decoded at the join")

    monkeypatch.setattr(worker_side, "DilocoWorkerSettings", rebuilt)
    first = worker_round(worker, Assignment(0, 1, 0, 1, 0, tensors({0: 1, 1: 2, 2: 3})))
    second = worker_round(worker, Assignment(1, 1, 0, 1, 0, tensors({0: 1})))
    assert [[t.name for t in w.tensors] for w in (first, second)] == [["p0"], ["p1", "p2"]]
    assert worker.algorithm_settings is settings.plugins["diloco"]


def test_an_overlapped_round_folds_the_parameters_in_as_they_arrive() -> None:
    worker = session(fragments=1)
    worker_round(worker, Assignment(0, 2, 0, 1, 0, tensors({0: 10, 1: 20, 2: 30})))
    # the outer step's new global parameters
    given = [Assignment(1, 2, 0, 1, 0, tensors({0: 9, 1: 18, 2: 29}))]

    def arrived(wait: bool) -> Assignment | None:
        return given.pop() if given else None

    worker.arrived = arrived
    ahead = worker_round(worker, Assignment(1, 2, 0, 1, 0))  # no tensors: speculative
    # the fold moved the parameters by (new global - where round 0 ended, 8/18/28): the
    # pseudo-gradient counts the two steps since the end of round 0, measured from the
    # new global parameters
    np.testing.assert_array_equal(worker.executor.params()[0], 7)
    assert [float(t.array[0]) for t in ahead.tensors] == [2, 2, 2]


def test_rounds_reported_ahead_fold_each_answer_onto_the_point_it_answers() -> None:
    # --overlap ahead: round 1 ends and is reported before its Assignment; round 2 then
    # takes in the answer to round 0 and, later, the one to round 1
    worker = session(fragments=1)
    worker_round(worker, Assignment(0, 2, 0, 1, 0, tensors({0: 10, 1: 20, 2: 30})))  # to 8
    early = worker_round(worker, Assignment(1, 2, 0, 1, 0))  # to 6, nothing arrived
    assert [float(t.array[0]) for t in early.tensors] == [2, 2, 2]
    assert [float(p[0]) for p in worker.unanswered[0]] == [8, 6]
    answers = [
        Assignment(1, 2, 0, 1, 0, tensors({0: 9, 1: 19, 2: 29})),  # answers round 0 (8)
        None,
        None,
        Assignment(2, 2, 0, 1, 0, tensors({0: 8, 1: 18, 2: 28})),  # answers round 1
        None,
    ]
    worker.arrived = lambda wait: answers.pop(0)  # type: ignore[assignment]
    third = worker_round(worker, Assignment(2, 2, 0, 1, 0))
    # the first answer moved everything by 9 - 8, round 1's end too (to 7); the second
    # by 8 - 7: the worker ends at the last global values less round 2's two steps
    np.testing.assert_array_equal(worker.executor.params()[0], 6)
    assert [float(t.array[0]) for t in third.tensors] == [2, 2, 2]
    assert [float(p[0]) for p in worker.unanswered[0]] == [6]  # round 2's end, due next
    assert not answers


def test_a_fragment_for_a_worker_without_the_parameters_is_refused() -> None:
    with pytest.raises(TransportError, match="part of the parameters"):
        worker_round(session(fragments=2), Assignment(0, 1, 0, 1, 0, tensors({0: 1})))


MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32, "batch_size": 8}


def train(out: Path, fragments: int, overlap: str) -> dict:
    config = RunConfig(
        algorithm="diloco",
        steps=160,
        eval_every=160,
        out=out,
        plugins={
            # one beta1 for every run compared (overlapped rounds keep --beta1's 0.9)
            "diloco": {
                "inner_steps": 40,
                "fragments": fragments,
                "overlap": overlap,
                "inner_momentum_decay": 0.9,
            },
            "shepherd": {"workers": 2},
        },
        **MODEL,
    )
    return run.train(config, dashboard=False)


@pytest.mark.slow
def test_a_run_of_fragments_moves_a_share_of_the_model_a_round_and_trains(tmp_path: Path) -> None:
    whole = train(tmp_path / "whole", 1, "none")
    streamed = train(tmp_path / "streamed", 4, "delayed")
    records = [json.loads(line) for line in (tmp_path / "streamed" / "metrics.jsonl").open()]
    rounds = [r for r in records if "round" in r]
    assert len(rounds) == 16 and all(r["workers"] == 2 for r in rounds)
    model = whole["model_bytes"]
    # after the first round (the whole model to each worker), a round's deltas and
    # refreshed fragments are each about a quarter of the model per worker
    for r in rounds[1:]:
        assert r["bytes_received"] < 2 * 0.45 * model and r["bytes_sent"] < 2 * 0.45 * model
    assert rounds[0]["bytes_sent"] > 2 * model
    assert streamed["final_val_loss"] < 1.15 * whole["final_val_loss"]
    assert streamed["final_val_loss"] < 0.8 * streamed["unigram_entropy"]


@pytest.mark.serial  # a supervisor's restart backoff
def test_a_killed_worker_rejoins_a_run_of_fragments_and_gets_the_whole_model(
    e2e: Any, tiny: tuple[str, ...], float32_wire: tuple[str, ...], tmp_path: Path
) -> None:
    """SIGKILL one of two overlapped workers of a run with fragments: the shepherd goes
    on with the other, the restarted worker is sent all the parameters (not the fragment
    the others get) and takes part again, and the run ends."""
    out = tmp_path / "run"
    run = e2e.pcp(
        "train",
        "train",
        *("--algorithm", "diloco", "--backend", "cpu", "--workers", "2", "--out", str(out)),
        *("--steps", "960", "--inner-steps", "12", "--fragments", "3", "--overlap", "delayed"),
        *float32_wire,  # a fragment is then a third of the bytes
        *("--eval-every", "0", *tiny),
    )
    e2e.wait_for(
        lambda: len(e2e.metrics(out)) >= 3 or run.process.poll() is not None, 180, "3 rounds"
    )
    assert run.process.poll() is None, run.output()[-4000:]
    address = f"127.0.0.1:{e2e.listening_port(run)}"
    e2e.own(address)
    killed_after = len(e2e.metrics(out))
    os.kill(e2e.pids_with(f"pcp_core worker --connect {address}")[0], signal.SIGKILL)
    assert run.wait(300) == 0, run.err()[-4000:]
    records = e2e.metrics(out)
    assert len(records) == 240  # about 25 s here: a restart and rejoin took 2.3 s
    workers = [r["workers"] for r in records]
    lost = workers.index(1, killed_after)
    assert 2 in workers[lost:], "the restarted worker never took part again"
    model = sum(r["bytes_sent"] for r in records[:1]) / 2  # round 0 sends each the model
    # the round it came back in sent it the whole model and the other a third of it
    # (4/3 of the model); the round after, a third to each (2/3)
    back = lost + workers[lost:].index(2)
    assert records[back]["bytes_sent"] > 1.2 * model > 1.5 * records[back + 1]["bytes_sent"]


@pytest.mark.parametrize("asked_before", [0, 1])  # as the first call ends, or waited for
def test_a_speculative_round_takes_the_budget_of_the_assignment_that_arrives(
    asked_before: int,
) -> None:
    # auto's first round measures with a budget shorter than any call; the round after
    # it starts speculatively with that budget, which must give way to the shepherd's
    worker = session(fragments=1)
    given = tensors({0: 1, 1: 2, 2: 3})
    first = worker_round(worker, Assignment(0, 2, 0, 1, 0, given, budget_s=1e-9))
    assert len(first.losses) == 1  # one call
    coming = [Assignment(1, 2, 0, 1, 0, given, budget_s=1e3)]
    asked: list[bool] = []

    def arrived(wait: bool) -> Assignment | None:
        asked.append(wait)
        return coming.pop() if coming and len(asked) > asked_before else None

    worker.arrived = arrived
    ahead = worker_round(worker, Assignment(1, 2, 0, 1, 0, budget_s=1e-9))  # predicted
    assert len(ahead.losses) == 8  # the arrived budget's most: 4 x H, not one call
