"""A worker's inner optimizer state on its own disk, so a restart costs at most one round.

After each round the worker writes its inner state (AdamW moments, step count: the
learning-rate schedule continues from it, and what its codec's error feedback owes,
`pcp_core.codecs.Feedback`) to `DIR/slot-N/round-R.npz`: temp file, fsync,
rename, so a crash leaves the previous file whole; npz members carry CRC-32s, so a
damaged file is detected on load and the one before it used. A shepherd that restarts
from its checkpoint asks again for the rounds after it, and each must start from the
state it started from the first time: with a checkpoint every C rounds that is up to C
rounds back, so the newest C + 1 states are kept (the shepherd says how many; KEEP
without word from it). On disk that is C + 1 copies of the inner state: with AdamW, two
model copies each.

A slot is held with an exclusive lock while its worker runs, so several workers can
share one state directory (the first free slot is taken); a file records the run id,
so state from another run is never loaded.
"""

import fcntl
import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import structlog

from pcp_core.backends import DeviceChoice, device_label

log = structlog.get_logger(__name__)

KEEP = 2
MAX_SLOTS = 64
_ROUND_FILE = re.compile(r"round-(\d+)\.npz$")
_OWED = "owed:"  # the npz member of what error feedback owes a tensor: this, then its name


@dataclass
class SavedState:
    """A state as saved after round `round`: the optimizer's arrays in the order of its
    specs, and what error feedback owed then, by tensor name."""

    round: int
    arrays: list[np.ndarray]
    owed: dict[str, np.ndarray]


class StateDirBusy(RuntimeError):
    """Every slot of a state directory is held by a running worker."""


class InnerStateStore:
    """The saved inner states of one worker slot."""

    def __init__(self, directory: Path) -> None:
        self.directory, self._lock = _take_slot(Path(directory))

    def previous_index(self) -> int:
        """The worker index of the newest saved state (-1 if none): ask for it again."""
        newest = self._files()
        return int(self._meta(newest[-1]).get("index", -1)) if newest else -1

    def save(
        self,
        run_id: str,
        index: int,
        round_index: int,
        arrays: list[np.ndarray],
        keep: int = KEEP,
        owed: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Save the state after round `round_index` (and what error feedback `owed`
        then); keep the `keep` newest of this run."""
        meta = {"run_id": run_id, "index": index, "round": round_index}
        path = self._path(round_index)
        partial = path.with_suffix(".partial")
        with partial.open("wb") as file:
            members: dict[str, Any] = {f"s{i}": a for i, a in enumerate(arrays)}
            members |= {_OWED + name: a for name, a in (owed or {}).items()}
            np.savez(file, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), **members)
            file.flush()
            os.fsync(file.fileno())
        partial.replace(path)
        _fsync_directory(self.directory)
        same_run = []
        for old in self._files():
            if self._meta(old).get("run_id") == run_id:
                same_run.append(old)
            else:
                old.unlink(missing_ok=True)
        for old in same_run[: -max(keep, 1)]:
            old.unlink(missing_ok=True)

    def newest_round(self, run_id: str) -> int | None:
        """The last round of `run_id` with a state saved here, or None."""
        rounds = [m["round"] for m in map(self._meta, self._files()) if m.get("run_id") == run_id]
        return max(rounds, default=None)

    def forget_from(self, round_index: int) -> None:
        """Forget the states saved after round `round_index` and every later one."""
        for path in self._files():
            if int(_ROUND_FILE.search(path.name).group(1)) >= round_index:  # type: ignore[union-attr]
                path.unlink(missing_ok=True)

    def _path(self, round_index: int) -> Path:
        return self.directory / f"round-{round_index:09d}.npz"

    def load(self, run_id: str, before_round: int) -> SavedState | None:
        """The newest intact state of `run_id` saved after a round before `before_round`."""
        for path in reversed(self._files()):
            try:
                with np.load(path) as data:
                    meta = json.loads(data["meta"].tobytes())
                    if meta["run_id"] != run_id or meta["round"] >= before_round:
                        continue
                    owing = [f for f in data.files if f.startswith(_OWED)]
                    owed = {f.removeprefix(_OWED): data[f] for f in owing}
                    arrays = [data[f"s{i}"] for i in range(len(data.files) - 1 - len(owing))]
                return SavedState(meta["round"], arrays, owed)
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
                log.warning(
                    "saved inner state unreadable; trying an older one",
                    file=str(path),
                    error=str(error),
                )
        return None

    def _files(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if _ROUND_FILE.search(p.name))

    @staticmethod
    def _meta(path: Path) -> dict:
        try:
            with np.load(path) as data:
                return json.loads(data["meta"].tobytes())
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            return {}


def default_state_dir(host: str, port: str, backend: str, device: DeviceChoice) -> Path:
    """Per shepherd address, backend and device(s), in the user's state directory."""
    import platformdirs

    devices = device_label(device).replace(",", "+")
    name = f"{host.strip('[]')}-{port}-{backend}-{devices}".replace(":", "_")
    return Path(platformdirs.user_state_dir("pcp")) / "workers" / name


def _take_slot(directory: Path) -> tuple[Path, IO[bytes]]:
    for slot in range(MAX_SLOTS):
        path = directory / f"slot-{slot}"
        path.mkdir(parents=True, exist_ok=True)
        lock = (path / "lock").open("wb")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return path, lock
    raise StateDirBusy(f"all {MAX_SLOTS} slots of {directory} are held by running workers")


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
