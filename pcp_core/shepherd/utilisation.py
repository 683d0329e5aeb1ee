"""Compute utilisation of a distributed run: how much of its workers' time went into
inner steps.

    utilisation = Σ compute seconds / (workers × wall seconds of the training phase)

The training phase starts when the rounds start (after the workers joined) and counts
everything after: rounds, fetches, evaluation and checkpoints between them. Compute is
what the accepted results report (a refused result's steps were wasted); `workers` is
the number the run was given, so a missing worker counts as idle. Each worker also
reports the seconds it was blocked waiting for the shepherd and sending
(`pcp_core.worker.clock`), kept per worker.
"""

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pcp_core.wire.messages import Result

TIMES = ("compute_s", "wait_s", "send_s")


def _timings(result: Result) -> dict[str, float]:
    return dict(zip(TIMES, (result.compute_s, result.waited_s, result.sent_s), strict=True))


@dataclass
class Utilisation:
    workers: int
    started: float = field(default_factory=time.perf_counter)
    compute_s: float = 0.0
    per_worker: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._round_ended = self.started

    def round(self, results: Mapping[int, Result]) -> dict[str, Any]:
        """The fields of a round's record: its cycle (seconds since the last round's
        record), this round's and the run's utilisation so far, and each worker's times."""
        now = time.perf_counter()
        cycle_s, self._round_ended = now - self._round_ended, now
        compute = sum(result.compute_s for result in results.values())
        self.compute_s += compute
        for index, result in results.items():
            totals = self.per_worker.setdefault(str(index), dict.fromkeys(TIMES, 0.0))
            for key, value in _timings(result).items():
                totals[key] += value
        record: dict[str, Any] = {
            "cycle_s": round(cycle_s, 4),
            "compute_utilisation": round(_share(compute, self.workers * cycle_s), 4),
            "run_compute_utilisation": round(self.so_far(now), 4),
        }
        for key in TIMES:
            record[f"worker_{key}"] = {
                str(index): round(_timings(result)[key], 4)
                for index, result in sorted(results.items())
            }
        return record

    def so_far(self, now: float | None = None) -> float:
        wall = (time.perf_counter() if now is None else now) - self.started
        return _share(self.compute_s, self.workers * wall)

    def summary(self) -> dict[str, Any]:
        """The summary.json fields: the training phase's wall time, its utilisation,
        each worker's total compute, waiting and sending seconds, and each worker's own
        utilisation (its compute over the training phase: unequal workers differ)."""
        now = time.perf_counter()
        training_s = now - self.started
        return {
            "training_s": round(training_s, 4),
            "compute_utilisation": round(self.so_far(now), 4),
            "worker_seconds": {
                index: {key: round(value, 4) for key, value in totals.items()}
                for index, totals in sorted(self.per_worker.items())
            },
            "worker_utilisation": {
                index: round(_share(totals["compute_s"], training_s), 4)
                for index, totals in sorted(self.per_worker.items())
            },
        }


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0
