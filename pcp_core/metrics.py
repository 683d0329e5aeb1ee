"""The run directory: metrics.jsonl, summary.json, config.toml and checkpoints."""

import json
import time
from datetime import datetime
from pathlib import Path
from typing import IO, Any


def new_run_dir(root: Path = Path("runs")) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = root / stamp
    suffix = 1
    while path.exists():
        suffix += 1
        path = root / f"{stamp}-{suffix}"
    return path


class MetricsLog:
    """Appends one JSON object per line and flushes it, so a crash loses nothing logged."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def write_json(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)
