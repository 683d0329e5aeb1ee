"""PCP's compile cache: where compiled programs are kept between runs, and how much.

One directory (`PCP_CACHE_DIR`, default `compiled/` in the user cache dir) holds three
kinds of entries:
- IREE modules, `<key>.vmfb` with `<key>.json` (`pcp_core.iree.compiler`);
- the StableHLO they are compiled from, `<key>.mlir` with `<key>.mlir.json`
  (`pcp_core.program.export_cache`);
- an `xla` worker's compiled steps, jax's persistent compilation cache in `xla/`
  (`pcp_xla.runtime.keep_compiled_steps`).

An entry is code that runs, and its key is computable by anyone, so the directory is
trusted only as far as it is private: it is created 0700 and used only while it belongs
to this user and no one else can write to it. Otherwise PCP compiles without it and
says why in a warning: the cache only saves time, and a run should not stop over it.

It is kept under a size (`PCP_CACHE_MAX_GB`, default 10): after PCP writes an entry,
the least recently used entries are removed until the rest fit. An entry's last use is
its files' latest access or modification time: Linux's default (relatime) notes the
first read after a write, then at most one a day; on a file system mounted noatime,
entries go in the order they were written.
"""

import dataclasses
import math
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

DEFAULT_MAX_GB = 10.0
# what `pcp cache` calls each kind of entry, by the file that marks it
KINDS = {".vmfb": "IREE modules", ".mlir": "exported programs", "-cache": "XLA executables"}
INCOMPLETE = "incomplete entries"  # a digest without its module, a crash's half-written file
KEY = re.compile("[0-9a-f]{64}")  # a sha256: how PCP names its entries
XLA_DIRECTORY = "xla"
XLA_AUTOTUNING = "xla_gpu_per_fusion_autotune_cache_dir"  # jax puts it in its cache dir
# a half-written file older than this was left by a crash, not by a writer still at it
PARTIAL_LEFTOVER_S = 3600.0


def cache_dir() -> Path:
    """Where the compile cache is: `PCP_CACHE_DIR`, else `compiled/` in the user cache
    dir. Not created, nor checked: see `private_cache_dir`."""
    override = os.environ.get("PCP_CACHE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("pcp")) / "compiled"


def unsafe_cache_dir_reason(directory: Path) -> str | None:
    """Why someone other than this user could change what `directory` holds; None if
    no one can. Give it a resolved path: a symbolic link is not a directory here."""
    try:
        info = directory.lstat()
    except OSError as error:
        return f"cannot inspect it: {error.strerror or error}"
    if not stat.S_ISDIR(info.st_mode):
        return "not a directory"
    if not hasattr(os, "getuid"):
        return None  # no POSIX owners and modes to check (Windows)
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not by this user (uid {os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"mode {stat.filemode(info.st_mode)}: group or others can write to it"
    return None


def private_cache_dir() -> Path | None:
    """`cache_dir()` where its links lead, created 0700 if missing; None, with a
    warning that says why, where others could change what it holds."""
    path = cache_dir()
    try:
        path.mkdir(mode=0o700, parents=True)
        path.chmod(0o700)  # the umask may have taken bits away, never added any
    except FileExistsError:
        pass
    except OSError as error:
        log.warning(
            "cannot create the compile cache; compiling without it",
            path=str(path),
            reason=error.strerror or str(error),
        )
        return None
    directory = path.resolve()
    reason = unsafe_cache_dir_reason(directory)
    if reason:
        log.warning(
            "compile cache not used: others could change its modules; compiling without it"
            " (use a directory of your own, chmod 700)",
            path=str(directory),
            reason=reason,
        )
        return None
    return directory


def write_atomically(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: a crash never leaves a truncated file there."""
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


@dataclasses.dataclass
class Entry:
    """The files of one cached program, and when it was last used."""

    kind: str
    files: list[Path]
    size: int
    last_used: float


def entries(directory: Path) -> list[Entry]:
    """The entries in `directory`, least recently used first; half-written files are left
    out unless a crash left them long ago."""
    groups: dict[tuple[Path, str], list[tuple[Path, os.stat_result]]] = {}
    now = time.time()
    for path in _files(directory):
        try:
            info = path.stat()
        except OSError:
            continue  # removed meanwhile by another process
        if path.name.endswith(".partial") and now - info.st_mtime < PARTIAL_LEFTOVER_S:
            continue
        groups.setdefault((path.parent, _stem(path)), []).append((path, info))
    found = [
        Entry(
            kind=next(filter(None, (_kind(path) for path, _ in files)), INCOMPLETE),
            files=sorted(path for path, _ in files),
            size=sum(info.st_size for _, info in files),
            last_used=max(max(info.st_atime, info.st_mtime) for _, info in files),
        )
        for files in groups.values()
    ]
    return sorted(found, key=lambda entry: entry.last_used)


def _files(directory: Path) -> Iterator[Path]:
    """PCP's files in `directory` (named by their keys), and jax's in `xla/` and below:
    nothing else that may be there, as where `PCP_CACHE_DIR` names a folder in use."""
    ours = (p for p in directory.glob("*") if KEY.fullmatch(_stem(p)))
    jaxs = (p for p in (directory / XLA_DIRECTORY).rglob("*") if not p.name.startswith("."))
    return (p for p in (*ours, *jaxs) if p.is_file())


def _stem(path: Path) -> str:
    """The name the files of one entry share: the key before the first dot (PCP's
    files), before `-cache` or `-atime` (jax's executables)."""
    return path.name.split(".")[0].removesuffix("-cache").removesuffix("-atime")


def _kind(path: Path) -> str | None:
    """The kind of entry `path` marks; None for a file that only goes with one (a digest,
    jax's access time)."""
    if path.parent.name == XLA_AUTOTUNING:
        return "XLA autotuning results"
    return next((kind for suffix, kind in KINDS.items() if path.name.endswith(suffix)), None)


def max_bytes() -> int:
    """The cache's size limit: `PCP_CACHE_MAX_GB` (a number of GB, 0 or more), else
    `DEFAULT_MAX_GB`; a value that is no such number is warned about and not used."""
    text = os.environ.get("PCP_CACHE_MAX_GB")
    gigabytes = DEFAULT_MAX_GB
    if text:
        try:
            gigabytes = float(text)
            if not 0 <= gigabytes < math.inf:
                raise ValueError
        except ValueError:
            log.warning(
                "PCP_CACHE_MAX_GB is not a number of GB (0 or more); keeping the default",
                value=text,
                default_gb=DEFAULT_MAX_GB,
            )
            gigabytes = DEFAULT_MAX_GB
    return int(gigabytes * 1e9)


def trim(directory: Path) -> list[Entry]:
    """Remove the least recently used entries of `directory` until the rest take at most
    `max_bytes()`; the entries removed. Another process may use an entry meanwhile: it
    finds it whole or not at all, and compiles again."""
    limit = max_bytes()
    found = entries(directory)
    total = sum(entry.size for entry in found)
    removed = []
    for entry in found:
        if total <= limit:
            break
        removed.append(entry)
        total -= entry.size
    remove(removed)
    if removed:
        log.info(
            "compile cache trimmed to its size limit",
            path=str(directory),
            removed=len(removed),
            freed_mb=round(sum(e.size for e in removed) / 1e6, 1),
            limit_mb=round(limit / 1e6, 1),
        )
    return removed


def remove(removed: list[Entry]) -> None:
    """Delete the entries' files (those already gone, by another process, too)."""
    for entry in removed:
        for path in entry.files:
            path.unlink(missing_ok=True)
