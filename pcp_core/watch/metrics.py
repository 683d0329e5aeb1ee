"""The metrics records of a run and the sinks every record goes to.

A metric sink is a plugin (`pcp_register_metric_sinks`): each run opens every installed
sink in its run directory, and `Metrics` hands each record to all of them. The JSONL
writer is one such sink, registered by the core like any plugin.
"""

import errno
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import structlog

log = structlog.get_logger(__name__)


def finite_json(value: Any) -> Any:
    """`value` with NaN and infinities as null: JSON has no spelling for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


class MetricsLog:
    """Appends one JSON object per line, unbuffered, so a crash loses nothing logged.
    A non-finite number is written as null, so every line stays valid JSON; a line that
    fails halfway (a full disk) is cut off again, so no broken line is left behind."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[bytes] = path.open("ab", buffering=0)

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(finite_json(record), allow_nan=False) + "\n").encode()
        size = os.fstat(self._file.fileno()).st_size
        try:
            if self._file.write(line) != len(line):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            os.ftruncate(self._file.fileno(), size)
            raise

    def keep_only(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        """Rewrite the log with the records `keep` accepts (a resumed run redoes the rest);
        a half-written last line is dropped."""
        self._file.close()
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if keep(record):
                kept.append(line + "\n")
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text("".join(kept), encoding="utf-8")
        partial.replace(self.path)
        self._file = self.path.open("ab", buffering=0)

    def close(self) -> None:
        self._file.close()


class MetricWriter(Protocol):
    """One run's writer of a metric sink. It may also have `keep_only(keep)`, called when
    a run resumes: the records `keep` refuses are written again by the resumed run."""

    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class MetricSink:
    """What a `pcp_register_metric_sinks` hook registers: `open(run_dir, config, resume)`
    returns the `MetricWriter` of one run (config: the run's settings, as config.toml has
    them; resume: the run continues the one in run_dir, else it is a new run there and
    what a sink finds of an earlier one is stale)."""

    name: str
    open: Callable[[Path, dict[str, Any], bool], MetricWriter]
    description: str = ""


JSONL = MetricSink(
    name="jsonl",
    open=lambda run_dir, config, resume: MetricsLog(run_dir / "metrics.jsonl"),
    description="metrics.jsonl in the run directory: one JSON object per record",
)


class Metrics:
    """A run's metrics: every record goes to every open sink and to the observers (the
    run's live status). A sink that fails is reported once and dropped, so a broken
    plugin never stops training."""

    def __init__(
        self,
        writers: dict[str, MetricWriter],
        observers: tuple[Callable[[dict[str, Any]], None], ...] = (),
    ) -> None:
        self.writers = dict(writers)
        self.observers = observers
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def write(self, record: dict[str, Any]) -> None:
        for observe in self.observers:
            observe(record)
        for name, writer in list(self.writers.items()):
            self._guarded(name, writer.write, record)

    def keep_only(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        for name, writer in list(self.writers.items()):
            if hasattr(writer, "keep_only"):
                self._guarded(name, writer.keep_only, keep)

    def close(self) -> None:
        for name, writer in list(self.writers.items()):
            self._guarded(name, writer.close)
        self.writers.clear()

    def _guarded(self, name: str, call: Callable[..., None], *args: Any) -> None:
        try:
            call(*args)
        except Exception as error:
            if name == JSONL.name and isinstance(error, OSError):  # a full disk, say
                log.error("metrics record not written; training goes on", error=str(error))
                return
            if name == JSONL.name:  # the run's own record: losing it must not go unseen
                raise
            log.warning("metric sink failed; dropping it", sink=name, error=repr(error))
            self.writers.pop(name, None)


def open_metrics(
    sinks: list[MetricSink],
    run_dir: Path,
    config: dict[str, Any],
    resume: bool,
    observers: tuple[Callable[[dict[str, Any]], None], ...] = (),
) -> Metrics:
    """Open every sink for the run in `run_dir`; one that cannot open is reported and
    left out (the JSONL writer excepted)."""
    writers: dict[str, MetricWriter] = {}
    for sink in sinks:
        try:
            writers[sink.name] = sink.open(run_dir, config, resume)
        except Exception as error:
            if sink.name == JSONL.name:
                raise
            log.warning(
                "metric sink could not open; leaving it out", sink=sink.name, error=repr(error)
            )
    return Metrics(writers, observers)
