"""TensorBoard event files of a PCP run, written as the run goes.

Every metrics record the run writes (the lines of metrics.jsonl) becomes scalars in
RUN_DIR/tensorboard, with the record's `step` as the x axis, so `tensorboard --logdir
RUN_DIR` shows the run while it trains. The writer is tensorboardX: no torch and no
TensorFlow. It is imported when a run opens the sink, never when the plugin is loaded.

The tags are the core's (`pcp_core.watch.scalars`; README.md has the table).

Each record is flushed to the file as it is written, so a crash loses little. A run that
replaces an earlier one (`--overwrite`) removes the earlier event files, as the core
removes the rest of that run; a resumed run (`--resume`) adds a file of its own, whose
first step TensorBoard takes as a restart: it drops the earlier data from that step on,
which the resumed run writes again.
"""

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pcp_core import hookimpl
from pcp_core.watch.metrics import MetricSink
from pcp_core.watch.scalars import Throughput, scalars, step_of

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for

FOLDER = "tensorboard"  # inside the run directory

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
        self.throughput = Throughput()

    def write(self, record: dict[str, Any]) -> None:
        step = step_of(record, self.records)
        if self.writer is None:
            self.writer = self._open(step)
        values = scalars(record)
        rate = self.throughput.tokens_per_s(record)
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
        self.throughput.restart()

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
