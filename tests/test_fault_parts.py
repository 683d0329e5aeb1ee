"""The parts fault tolerance is built from, one at a time: result checks, the norm bound,
staged deltas, saved inner states and checkpoints that survive damage."""

import itertools
import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from pcp_core.parallel import delta_norm
from pcp_core.program import checkpoint
from pcp_core.program.build import TensorSpec
from pcp_core.shepherd.accountability import Accountability
from pcp_core.shepherd.aggregation import (
    BadResult,
    DeltaSink,
    MalformedDelta,
    NonFinite,
    NormBound,
    RunningSum,
    StagingPool,
    check_delta,
    check_result,
    step_norm,
)
from pcp_core.shepherd.rounds import RoundOutcome, _check_reports
from pcp_core.watch.metrics import MetricsLog
from pcp_core.watch.run_status import RunStatus
from pcp_core.wire.messages import Assignment, Result, WorkerSettings
from pcp_core.wire.transport import TensorHeader
from pcp_core.worker.state import InnerStateStore

SPECS = [TensorSpec("w", (2, 3), "float32"), TensorSpec("b", (3,), "float32")]


def arrays(scale: float = 1.0) -> list[np.ndarray]:
    return [np.full(s.shape, scale, np.float32) for s in SPECS]


def test_result_checks() -> None:
    check_result(Result(4, 1, [2.0, 1.5], 3.0, 0.5), 4, 1)
    with pytest.raises(BadResult, match="stale result: for round 3"):
        check_result(Result(3, 1, [2.0], 3.0, 0.5), 4, 1)
    with pytest.raises(BadResult, match="attempt 0"):
        check_result(Result(4, 0, [2.0], 3.0, 0.5), 4, 1)
    with pytest.raises(NonFinite):
        check_result(Result(4, 1, [float("nan")], 3.0, 0.5), 4, 1)
    with pytest.raises(NonFinite):
        check_result(Result(4, 1, [1.0], 3.0, float("inf")), 4, 1)


def test_norm_bound_uses_the_median() -> None:
    bound = NormBound(ratio=10)
    assert bound.limit([1.0, 1000.0]) is None  # two norms: no telling who is off
    limit = bound.limit([1.0, 1.2, 0.9, 1000.0])
    assert limit is not None and 10 < limit < 12  # the outlier does not move the median
    bound.check(5.0, limit)
    with pytest.raises(BadResult, match="over 10x the median"):
        bound.check(1000.0, limit)
    bound.remember([1.0, 1.1, 0.9])
    assert bound.limit([1000.0]) == pytest.approx(10 * 1.05)  # history is reference too


def test_norms_compare_over_steps_so_unequal_work_is_not_refused() -> None:
    # rounds by time on an H200: a GPU worker ran 790 steps beside CPU workers' 10 early
    # in a run, 350 beside their 2 later; neither kind is refused, whichever is the
    # majority (plain norms refuse a GPU among CPUs, norms per step a CPU among GPUs)
    for gpu, cpu in (((790, 60.0), (10, 1.9)), ((350, 27.0), (2, 2.2))):
        for many, few in ((gpu, cpu), (cpu, gpu)):
            results = [Result(1, 0, [2.0] * few[0], 8.0, norm=few[1])]
            results += [Result(1, 0, [3.0] * many[0], 8.0, norm=many[1] * f) for f in (0.9, 1.1)]
            bound = NormBound(ratio=10)
            limit = bound.limit([step_norm(r) for r in results])
            for result in results:
                bound.check(step_norm(result), limit)
    # the GPU's norm from the CPU's steps is refused
    with pytest.raises(BadResult, match="over steps"):
        bound.check(step_norm(Result(1, 0, [2.0] * 2, 8.0, norm=60.0)), limit)


def test_a_result_refused_for_its_norm_still_reports_its_speed() -> None:
    # rounds by time learn each worker's speed from its report, refused or not: a
    # refused GPU worker forgotten made the next round the CPU's H steps (162 s)
    plan = SimpleNamespace(
        round=1,
        attempt=0,
        excluded={},
        assignments={i: Assignment(1, 10, 0, 1, 0) for i in range(3)},
        status=RunStatus(log_progress=False),
        accountability=Accountability(),
        spot_checks=None,
    )
    links = [
        SimpleNamespace(
            index=i,
            label=f"w{i}",
            hello=SimpleNamespace(worker_name=f"w{i}"),
            conn=SimpleNamespace(send=lambda message: None),
        )
        for i in range(3)
    ]
    norms = (1.0, 1.1, 1000.0)
    reports = [(links[i], Result(1, 0, [1.0] * 10, 2.0, norms[i]), None) for i in range(3)]
    outcome = RoundOutcome(1, 0)
    accepted = _check_reports(plan, reports, NormBound(ratio=10), outcome)  # type: ignore[arg-type]
    assert [link.index for link, _, _ in accepted] == [0, 1] and 2 in outcome.rejected
    assert sorted(outcome.reported) == [0, 1, 2]


def test_delta_checks() -> None:
    good = arrays()
    check_delta(good, 2, delta_norm(good))
    with pytest.raises(BadResult, match="incomplete result: 1 of 2"):
        check_delta(good, 1, delta_norm(good))
    with pytest.raises(BadResult, match="announced"):
        check_delta(good, 2, 10 * delta_norm(good))  # a worker that lies about its norm
    broken = arrays()
    broken[1][0] = np.inf
    with pytest.raises(NonFinite):
        check_delta(broken, 2, 1.0)


def test_delta_sink_refuses_foreign_tensors() -> None:
    sink = DeltaSink(arrays(), SPECS)
    assert sink.buffer(0, TensorHeader("w", "float32", (2, 3), 24)).shape == (2, 3)
    for header in [
        TensorHeader("w", "float32", (3, 2), 24),
        TensorHeader("w", "float64", (2, 3), 48),
        TensorHeader("x", "float32", (2, 3), 24),
    ]:
        with pytest.raises(MalformedDelta):
            sink.buffer(0, header)
    with pytest.raises(MalformedDelta):
        sink.buffer(2, TensorHeader("extra", "float32", (1,), 4))


def test_staging_pool_bounds_deltas_in_flight() -> None:
    pool = StagingPool(SPECS, count=2)
    inside, most = [0], [0]
    lock = threading.Lock()

    def use() -> None:
        with pool.buffer():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            threading.Event().wait(0.01)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] <= 2


def test_running_sum_adds_whole_deltas() -> None:
    sums = [a.astype(np.float64) for a in arrays(scale=7.0)]
    total = RunningSum(sums)  # starts from zero
    total.add(arrays(1.0))
    total.add(arrays(2.0))
    means = arrays(0.0)
    total.mean_into(means)
    assert total.weight == 2 and all((s == 3.0).all() for s in sums)
    assert all(m.dtype == np.float32 and (m == 1.5).all() for m in means)
    with pytest.raises(TypeError, match="float64"):
        RunningSum(arrays())


def test_the_mean_does_not_depend_on_the_order_deltas_arrive_in() -> None:
    """In float32, ((a + b) + c) + d changes with the order: the same DiLoCo run with
    four workers and one seed ended 0.4% apart after 1000 steps."""
    rng = np.random.default_rng(0)
    deltas = [
        [rng.normal(0, 10.0**k, s.shape).astype(np.float32) for s in SPECS] for k in range(-4, 0)
    ]
    float32_sums, means = set(), set()
    for order in itertools.permutations(range(4)):
        total = RunningSum([np.zeros(s.shape, np.float64) for s in SPECS])
        for index in order:
            total.add(deltas[index])
        mean = arrays(0.0)
        total.mean_into(mean)
        means.add(b"".join(m.tobytes() for m in mean))
        float32_sum = [np.zeros(s.shape, np.float32) for s in SPECS]
        for index in order:
            for into, delta in zip(float32_sum, deltas[index], strict=True):
                into += delta
        float32_sums.add(b"".join(t.tobytes() for t in float32_sum))
    assert len(means) == 1
    assert len(float32_sums) > 1  # the problem this solves is real for these deltas


def test_inner_state_store(tmp_path) -> None:
    store = InnerStateStore(tmp_path / "state")
    assert store.previous_index() == -1 and store.load("run", 5) is None
    for round_index in range(4):
        store.save("run", 3, round_index, arrays(round_index))
    assert store.previous_index() == 3
    assert [p.name for p in store._files()] == ["round-000000002.npz", "round-000000003.npz"]
    saved = store.load("run", before_round=4)
    assert saved.round == 3 and saved.arrays[0][0, 0] == 3 and saved.owed == {}
    assert store.load("run", before_round=3).round == 2  # a round asked for again
    assert store.load("other-run", 9) is None
    store.forget_from(3)  # a refused round: the next starts from the state before it
    assert store.load("run", before_round=9).round == 2
    store.save("run", 3, 3, arrays(3))
    store.save("run", 3, 4, arrays(4), keep=3)  # and one reported ahead of it, gone too
    store.forget_from(3)
    assert store.load("run", before_round=9).round == 2
    store.save("run", 3, 3, arrays(3))
    store._files()[-1].write_bytes(b"torn")  # a damaged newest file: the one before it
    assert store.load("run", before_round=9).round == 2
    owed = {"h.0/w": np.full((2, 3), 0.5, np.float32)}  # what error feedback owes, kept
    store.save("run", 3, 3, arrays(3), owed=owed)
    saved = store.load("run", before_round=9)
    assert saved.round == 3 and len(saved.arrays) == len(arrays(3))
    np.testing.assert_array_equal(saved.owed["h.0/w"], owed["h.0/w"])
    store.save("new-run", 0, 0, arrays())  # another run's states are cleared away
    assert [p.name for p in store._files()] == ["round-000000000.npz"]


def test_state_directory_slots_are_exclusive(tmp_path) -> None:
    first = InnerStateStore(tmp_path)
    second = InnerStateStore(tmp_path)
    assert first.directory != second.directory


def test_checkpoint_falls_back_to_the_previous_one(tmp_path) -> None:
    path = tmp_path / "checkpoint.safetensors"
    checkpoint.save(path, {"w": np.ones(3, np.float32)}, {"round": 1})
    checkpoint.save(path, {"w": np.full(3, 2, np.float32)}, {"round": 2})
    tensors, metadata = checkpoint.load_latest(path)
    assert metadata["round"] == "2" and tensors["w"][0] == 2
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the tensor bytes
    path.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="checksum"):
        checkpoint.load(path)
    assert checkpoint.load_latest(path)[1]["round"] == "1"
    path.write_bytes(data[:20])  # truncated
    assert checkpoint.load_latest(path)[1]["round"] == "1"
    checkpoint.previous_path(path).unlink()
    with pytest.raises(checkpoint.CheckpointError, match="no intact checkpoint"):
        checkpoint.load_latest(path)


def test_a_changed_bit_in_the_metadata_is_caught(tmp_path) -> None:
    """The round to resume from is metadata: one bit of it changed (7 -> 6, the same
    length, so the file still parses) fails the checksum like a tensor's bit would."""
    path = tmp_path / "checkpoint.safetensors"
    checkpoint.save(path, {"w": np.ones(3, np.float32)}, {"diloco": {"next_round": 6}})
    checkpoint.save(path, {"w": np.ones(3, np.float32)}, {"diloco": {"next_round": 7}})
    data = path.read_bytes()
    assert data.count(b'next_round\\": 7') == 1
    path.write_bytes(data.replace(b'next_round\\": 7', b'next_round\\": 6'))
    with pytest.raises(checkpoint.CheckpointError, match="checksum"):
        checkpoint.load(path)
    assert json.loads(checkpoint.load_latest(path)[1]["diloco"])["next_round"] == 6


def test_a_checkpoint_from_before_the_metadata_checksum_loads(tmp_path) -> None:
    from safetensors.numpy import save_file

    path = tmp_path / "checkpoint.safetensors"
    tensors = {"w": np.ones(3, np.float32)}
    save_file(tensors, path, {"step": "3", "sha256": checkpoint._digest(tensors)})
    assert checkpoint.load(path)[1]["step"] == "3"
    save_file(tensors, path, {"step": "3", "sha256": "0" * 64})
    with pytest.raises(checkpoint.CheckpointError, match="checksum"):
        checkpoint.load(path)


def test_a_failed_write_keeps_the_earlier_checkpoints(tmp_path, monkeypatch) -> None:
    path = tmp_path / "checkpoint.safetensors"
    checkpoint.save(path, {"w": np.ones(3, np.float32)}, {"round": 1})
    checkpoint.save(path, {"w": np.full(3, 2, np.float32)}, {"round": 2})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def no_space(*args, **kwargs) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", no_space)
    with pytest.raises(checkpoint.CheckpointWriteError, match="No space left on device"):
        checkpoint.save(path, {"w": np.full(3, 3, np.float32)}, {"round": 3})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_metrics_stay_valid_json(tmp_path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"round": 0, "loss": float("nan"), "worker_losses": {"0": float("inf")}})
    log.write({"round": 1, "loss": 1.5})
    log.keep_only(lambda record: record["round"] < 1)
    log.write({"round": 1, "loss": 1.25})
    log.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines == [
        '{"round": 0, "loss": null, "worker_losses": {"0": null}}',
        '{"round": 1, "loss": 1.25}',
    ]


class StateOnly:
    """An executor that holds an optimizer state and nothing else."""

    def __init__(self) -> None:
        self.state = [np.zeros(2, np.float32)]

    def set_opt_state(self, arrays: list[np.ndarray]) -> None:
        self.state = arrays

    def opt_state(self) -> list[np.ndarray]:
        return self.state


@pytest.mark.parametrize(
    ("keep", "asked", "says"),
    [
        (6, 3, "inner state restored"),  # kept back to the checkpoint: exact
        (2, 3, "is gone; it starts from a fresh one"),  # pruned: said, not silent
        (2, 9, "inner state restored"),  # a worker that missed rounds goes on from its last
    ],
)
def test_a_lost_inner_state_is_said(tmp_path, keep: int, asked: int, says: str) -> None:
    from structlog.testing import capture_logs

    from pcp_core.worker.session import InnerState, WorkerSession

    executor = StateOnly()
    session = WorkerSession(0, executor, None, WorkerSettings("local", "run", keep))
    inner = InnerState(session, InnerStateStore(tmp_path), "run")
    for round_index in range(6):
        executor.state = [np.full(2, round_index, np.float32)]
        inner.finished(round_index)
    inner.after_round = None  # a restarted worker
    with capture_logs() as logs:
        inner.prepare(asked)
    assert any(says in entry["event"] for entry in logs), logs


def test_a_rounds_inner_state_is_written_beside_what_follows(tmp_path, monkeypatch) -> None:
    """`finished` copies the round's state and returns while a thread of its own
    ("inner-state") writes it: the next round may change the device's state meanwhile.
    Reading the store (a round that must restore) and `saved` (the worker's end) wait
    for the write."""
    from pcp_core.worker.session import InnerState, WorkerSession
    from pcp_core.worker.state import InnerStateStore

    executor = StateOnly()
    session = WorkerSession(0, executor, None, WorkerSettings("local", "run", 3))
    store = InnerStateStore(tmp_path)
    release, writers = threading.Event(), []
    write = store.save

    def held(*args: object) -> None:
        writers.append(threading.current_thread().name)
        assert release.wait(30)
        write(*args)

    monkeypatch.setattr(store, "save", held)
    inner = InnerState(session, store, "run")
    executor.state = [np.full(2, 7, np.float32)]
    inner.finished(0)  # returns with the write held
    executor.state = [np.full(2, 8, np.float32)]  # the next round moves on
    for _ in range(300):  # the write starts on its thread
        if writers:
            break
        time.sleep(0.01)
    assert writers == ["inner-state"] and store.newest_round("run") is None

    inner.after_round = None  # round 1 asked again: its state comes from the store
    restoring = threading.Thread(target=inner.prepare, args=(1,))
    restoring.start()
    restoring.join(0.5)
    assert restoring.is_alive(), "read the store before the write in flight ended"
    release.set()
    restoring.join(30)
    np.testing.assert_array_equal(executor.state[0], np.full(2, 7, np.float32))

    release.clear()
    inner.finished(1)
    ending = threading.Thread(target=inner.saved)
    ending.start()
    ending.join(0.5)
    assert ending.is_alive(), "the worker would end before its last state is written"
    release.set()
    ending.join(30)
    assert store.newest_round("run") == 1


def test_a_restored_inner_state_takes_the_runs_schedule(tmp_path) -> None:
    """A run resumed with a larger --steps keeps its run id, so its workers restore the
    inner states they saved; the learning-rate schedule in them is the old run's, and
    the Setup's (the resumed run's) replaces it."""
    from pcp_core.program.build import SCHEDULE_TENSOR
    from pcp_core.worker.session import InnerState, WorkerSession

    specs = (("opt.mu", (2,), "float32"), (SCHEDULE_TENSOR, (4,), "float32"))
    settings = WorkerSettings("local", "run", 3, opt_specs=specs)
    executor = StateOnly()
    old_schedule = np.float32([1e-3, 1e-4, 10, 100])
    new_schedule = np.float32([1e-3, 1e-4, 10, 400])
    store = InnerStateStore(tmp_path)
    saving = InnerState(WorkerSession(0, executor, None, settings), store, "run")
    executor.state = [np.full(2, 5, np.float32), old_schedule]
    saving.finished(0)
    saving.saved()

    restarted = StateOnly()
    inner = InnerState(
        WorkerSession(0, restarted, None, settings),
        store,
        "run",
        from_setup={SCHEDULE_TENSOR: new_schedule},
    )
    inner.prepare(1)
    np.testing.assert_array_equal(restarted.state[0], np.full(2, 5, np.float32))  # its own
    np.testing.assert_array_equal(restarted.state[1], new_schedule)  # the run's


@pytest.mark.parametrize("overlap", [False, True])
def test_what_error_feedback_owes_is_saved_and_restored_with_the_inner_state(
    tmp_path, overlap: bool
) -> None:
    """In blocking rounds what the codec's error feedback owes after a round is saved with
    the round's inner state: a refused round owes again what it owed when it started, and
    a restarted worker what it owed at the end of the round it goes on from. Under
    overlap a round's state is saved before its result is encoded: what is owed stays."""
    from pcp_core import plugins
    from pcp_core.codecs import Feedback
    from pcp_core.worker.session import InnerState, WorkerSession

    executor = StateOnly()
    settings = WorkerSettings("local", "run", 3, overlap=overlap)
    feedback = Feedback(plugins.host().codec("topk"))
    inner = InnerState(WorkerSession(0, executor, None, settings), InnerStateStore(tmp_path), "run")
    inner.feedback = feedback
    owed = {}
    for round_index in range(3):
        executor.state = [np.full(2, round_index, np.float32)]
        feedback.encode("w", np.arange(8, dtype=np.float32) + round_index)
        owed[round_index] = feedback.residuals["w"].copy()
        inner.finished(round_index)
    inner.refused(2)  # round 2's result refused: it starts again from round 1's end
    np.testing.assert_array_equal(executor.state[0], np.full(2, 1, np.float32))
    expected = owed[2] if overlap else owed[1]
    np.testing.assert_array_equal(feedback.residuals["w"], expected)

    restarted = Feedback(feedback.codec)
    again = InnerState(WorkerSession(0, StateOnly(), None, settings), inner.store, "run")
    again.feedback = restarted
    again.prepare(2)
    assert restarted.residuals == {} if overlap else restarted.residuals.keys() == {"w"}
    if not overlap:
        np.testing.assert_array_equal(restarted.residuals["w"], owed[1])
