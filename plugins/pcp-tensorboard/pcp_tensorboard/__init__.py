"""TensorBoard event files of a PCP run, written as the run goes.

Every metrics record the run writes (the lines of metrics.jsonl) becomes scalars in
RUN_DIR/tensorboard, with the record's `step` as the x axis, so `tensorboard --logdir
RUN_DIR` shows the run while it trains. The writer is tensorboardX: no torch and no
TensorFlow. It is imported when a run opens the sink, never when the plugin is loaded.

The tags (README.md has the table):

    loss/train, loss/train_mean, loss/val, loss/worker/ID
    throughput/tokens, throughput/tokens_per_s
    network/bytes_sent, network/bytes_received
    time/elapsed_s, time/round_s, time/compute_s, time/communication_s, time/cycle_s
    time/compute_utilisation, time/run_compute_utilisation
    time/worker/ID/compute_s, time/worker/ID/wait_s, time/worker/ID/send_s
    workers/count, workers/attempts, workers/rejected
    other/KEY (other/KEY/SUBKEY): any other number a record holds

Each record is flushed to the file as it is written, so a crash loses little. A run that
replaces an earlier one (`--overwrite`) removes the earlier event files, as the core
removes the rest of that run; a resumed run (`--resume`) adds a file of its own, whose
first step TensorBoard takes as a restart: it drops the earlier data from that step on,
which the resumed run writes again.
"""

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pcp_core import hookimpl
from pcp_core.watch.metrics import MetricSink

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for

FOLDER = "tensorboard"  # inside the run directory

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


def is_number(value: Any) -> bool:
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


# What tensorboardX's package imports at its top, where installed, for features this
# writer never uses (torch tensors as values, comet.ml, S3 and GCS paths): torch alone
# takes 3 s and 200 MB of the run's process. Hidden from it while it loads, so its
# `except ImportError` branches run; the names import as usual afterwards.
UNUSED_BY_US = ("torch", "comet_ml", "boto3", "google.cloud")


@contextlib.contextmanager
def hidden(modules: tuple[str, ...]) -> Iterator[None]:
    """Make `import NAME` fail for those of `modules` not yet imported, in this block."""
    absent = [name for name in modules if name not in sys.modules]
    for name in absent:
        sys.modules[name] = None  # type: ignore[assignment]  # Python's "import fails" mark
    try:
        yield
    finally:
        for name in absent:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


class TensorBoardWriter:
    """One run's event file, written as records come, in the caller's thread.

    tensorboardX's `SummaryWriter` queues events for a thread of its own, and its
    `flush()` does not wait for that queue; the `EventsWriter` under it writes and
    flushes here and now, so each record is in the file when `write` returns.

    The file is created by the run's first record, and starts by marking that record's
    step as a (re)start, as tensorboardX's `purge_step` does: TensorBoard drops what
    earlier files hold from that step on. That is what a resumed run needs. Any other
    run is a new one, and the event files already in the folder are those of an earlier
    run it replaces (`--overwrite` removed the rest of that run): they are removed.
    """

    def __init__(self, folder: Path, config: dict[str, Any], resumed: bool) -> None:
        # here, not at the top: loading the plugin must stay cheap
        with hidden(UNUSED_BY_US):
            from tensorboardX.event_file_writer import EventsWriter
            from tensorboardX.proto.event_pb2 import Event, SessionLog
            from tensorboardX.proto.summary_pb2 import Summary
            from tensorboardX.summary import text

        self._events_writer, self._event, self._session_log = EventsWriter, Event, SessionLog
        self._summary, self._text = Summary, text
        self.folder = folder
        self.config = config
        self.writer: Any = None
        self.resumed = resumed
        self.records = 0
        self.last: tuple[float, float] | None = None  # (elapsed_s, tokens) of the last record

    def write(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if is_number(step) and math.isfinite(step) and step == int(step):
            step = int(step)
        else:
            step = self.records  # an algorithm whose records have no step: their count
        if self.writer is None:
            self.writer = self._open(step)
        values = scalars(record)
        rate = self.tokens_per_s(record)
        if rate is not None:
            values["throughput/tokens_per_s"] = rate
        summary = self._summary(
            value=[self._summary.Value(tag=tag, simple_value=v) for tag, v in values.items()]
        )
        self.writer.write_event(self._event(wall_time=time.time(), step=step, summary=summary))
        self.writer.flush()  # into the file now: a crash loses little
        self.records += 1

    def _open(self, step: int) -> Any:
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self.resumed:
            for stale in self.folder.glob("events.out.tfevents.*"):
                stale.unlink()
        # tensorboardX names the file by the second and the host only, and a second writer
        # of that name would truncate the first: the nanosecond (which keeps TensorBoard's
        # reading order, by name, the order of writing) and the process make it unique
        suffix = f".{time.time_ns()}.{os.getpid()}"
        writer = self._events_writer(str(self.folder / "events"), suffix)
        now = time.time()
        # every file starts so: TensorBoard takes the first START of a folder as its start,
        # and each one after it as a restart, and drops what came before from its step on
        start = self._session_log(status=self._session_log.START)
        writer.write_event(self._event(wall_time=now, step=step, session_log=start))
        config = json.dumps(self.config, indent=2, sort_keys=True, default=str)
        indented = "\n".join("    " + line for line in config.splitlines())  # a code block
        summary = self._text("config", indented)
        writer.write_event(self._event(wall_time=now, step=step, summary=summary))
        return writer

    def keep_only(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        """The run resumes: its next record is the first one it writes again (which
        records `keep` keeps is told by the steps the resumed run writes)."""
        self.close()
        self.resumed = True
        self.last = None

    def tokens_per_s(self, record: dict[str, Any]) -> float | None:
        """Tokens per second since the previous record (none for the first: it would
        count the compile and set-up time)."""
        elapsed, tokens = record.get("elapsed_s"), record.get("tokens")
        if not (is_number(elapsed) and is_number(tokens)):
            return None
        last, self.last = self.last, (float(elapsed), float(tokens))
        if last is None or not math.isfinite(elapsed - last[0]) or elapsed <= last[0]:
            return None
        return (tokens - last[1]) / (elapsed - last[0])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def open_writer(run_dir: Path, config: dict[str, Any], resume: bool) -> TensorBoardWriter:
    return TensorBoardWriter(run_dir / FOLDER, config, resume)


TENSORBOARD = MetricSink(
    name="tensorboard",
    open=open_writer,
    description=f"TensorBoard event files in RUN_DIR/{FOLDER} (tensorboard --logdir RUN_DIR)",
)


@hookimpl
def pcp_register_metric_sinks(register) -> None:
    register(TENSORBOARD)
