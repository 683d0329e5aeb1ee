"""Compute utilisation: the workers' own account of their time, and the run's share."""

import math
import time

import pytest

from pcp_core.shepherd import utilisation
from pcp_core.shepherd.aggregation import BadResult, check_result
from pcp_core.shepherd.utilisation import Utilisation
from pcp_core.wire.messages import Result
from pcp_core.worker.clock import NetworkClock


def result(compute_s: float, waited_s: float = 0.0, sent_s: float = 0.0) -> Result:
    return Result(0, 0, [1.0], compute_s, 1.0, waited_s, sent_s)


def test_a_round_and_the_run_count_compute_over_every_workers_time(monkeypatch) -> None:
    now = iter([110.0, 130.0, 140.0])  # round 0 ends, round 1 ends, the summary
    monkeypatch.setattr(utilisation.time, "perf_counter", lambda: next(now))
    account = Utilisation(workers=2, started=100.0)
    first = account.round({0: result(8.0, 1.5, 0.5), 1: result(6.0, 3.0, 1.0)})
    assert first["cycle_s"] == 10.0 and first["compute_utilisation"] == 0.7  # 14 / (2 x 10)
    assert first["worker_wait_s"] == {"0": 1.5, "1": 3.0}
    second = account.round({0: result(10.0)})  # worker 1 missing: idle, not left out
    assert second["compute_utilisation"] == 0.25  # 10 / (2 x 20)
    assert second["run_compute_utilisation"] == 0.4  # 24 / (2 x 30)
    summary = account.summary()
    assert summary["training_s"] == 40.0 and summary["compute_utilisation"] == 0.3
    assert summary["worker_seconds"]["0"] == {"compute_s": 18.0, "wait_s": 1.5, "send_s": 0.5}


class SlowConnection:
    def receive(self) -> str:
        time.sleep(0.05)
        return "message"

    def send(self, message: object) -> None:
        time.sleep(0.02)


def test_the_worker_clock_counts_time_blocked_on_the_connection() -> None:
    clock, conn = NetworkClock(), SlowConnection()
    assert clock.receive(conn) == "message"
    clock.send(conn, "reply")
    waited, sent = clock.take()
    assert 0.05 <= waited < 1 and 0.02 <= sent < 1
    assert clock.take() == (0.0, 0.0)  # counting starts again


@pytest.mark.parametrize("timings", [(-1.0, 0, 0), (1.0, math.inf, 0), (1.0, 0, math.nan)])
def test_a_result_with_impossible_timings_is_refused(timings: tuple[float, ...]) -> None:
    with pytest.raises(BadResult, match="impossible timings"):
        check_result(result(*timings), 0, 0)
