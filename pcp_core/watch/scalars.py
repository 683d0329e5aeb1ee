"""A metrics record as named scalars: the tags every tracker sink shows (the TensorBoard
and MLflow plugins), and the throughput between two records.

    loss/train, loss/train_mean, loss/val, loss/worker/ID
    throughput/tokens, throughput/tokens_per_s
    network/bytes_sent, network/bytes_received
    time/elapsed_s, time/round_s, time/compute_s, time/communication_s, time/cycle_s
    time/compute_utilisation, time/run_compute_utilisation
    time/worker/ID/compute_s, time/worker/ID/wait_s, time/worker/ID/send_s
    workers/count, workers/attempts, workers/rejected
    other/KEY (other/KEY/SUBKEY): any other number a record holds
"""

import math
from typing import Any, TypeGuard

# Record key -> scalar tag. `step` is the x axis; `round` is step / inner steps.
TAGS = {
    "loss": "loss/train",
    "loss_mean": "loss/train_mean",
    "val_loss": "loss/val",
    "tokens": "throughput/tokens",
    "bytes_sent": "network/bytes_sent",
    "bytes_received": "network/bytes_received",
    "elapsed_s": "time/elapsed_s",
    "round_s": "time/round_s",
    "compute_s": "time/compute_s",
    "communication_s": "time/communication_s",
    "cycle_s": "time/cycle_s",
    "compute_utilisation": "time/compute_utilisation",
    "run_compute_utilisation": "time/run_compute_utilisation",
    "workers": "workers/count",
    "attempts": "workers/attempts",
}
NOT_PLOTTED = {"step", "round"}
# each worker's seconds in a round (pcp_core.shepherd.utilisation), by worker
WORKER_TIMES = {
    "worker_compute_s": "compute_s",
    "worker_wait_s": "wait_s",
    "worker_send_s": "send_s",
}


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars of one metrics record, by tag (without throughput/tokens_per_s, which
    needs the record before)."""
    found: dict[str, float] = {}
    for key, value in record.items():
        if key in NOT_PLOTTED:
            continue
        if key == "worker_losses" and isinstance(value, dict):
            found |= {f"loss/worker/{w}": float(v) for w, v in value.items() if is_number(v)}
        elif key == "rejected" and isinstance(value, dict):
            found["workers/rejected"] = float(len(value))
        elif is_number(value):
            found[TAGS.get(key, f"other/{key}")] = float(value)
        elif key in WORKER_TIMES and isinstance(value, dict):
            tag = WORKER_TIMES[key]
            found |= {f"time/worker/{w}/{tag}": float(v) for w, v in value.items() if is_number(v)}
        elif isinstance(value, dict):
            found |= {f"other/{key}/{k}": float(v) for k, v in value.items() if is_number(v)}
    return found


def step_of(record: dict[str, Any], records: int) -> int:
    """The record's `step`, or for an algorithm whose records have none, their count."""
    step = record.get("step")
    if is_number(step) and math.isfinite(step) and step == int(step):
        return int(step)
    return records


class Throughput:
    """Tokens per second between two records (none for a run's first, which would count
    the compile and set-up time)."""

    def __init__(self) -> None:
        self.last: tuple[float, float] | None = None  # (elapsed_s, tokens) of the last record

    def tokens_per_s(self, record: dict[str, Any]) -> float | None:
        elapsed, tokens = record.get("elapsed_s"), record.get("tokens")
        if not (is_number(elapsed) and is_number(tokens)):
            return None
        last, self.last = self.last, (float(elapsed), float(tokens))
        if last is None or not math.isfinite(elapsed - last[0]) or elapsed <= last[0]:
            return None
        return (tokens - last[1]) / (elapsed - last[0])

    def restart(self) -> None:
        """A resumed run: its next record has no record before it."""
        self.last = None
