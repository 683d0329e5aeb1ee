"""PCP's compile cache: where compiled programs are kept between runs, and how much.

One directory (`PCP_CACHE_DIR`, default `compiled/` in the user cache dir) holds these
kinds of entries:
- IREE modules, `<key>.vmfb` with `<key>.json` (`pcp_core.iree.compiler`);
- the StableHLO they are compiled from, `<key>.mlir` with `<key>.mlir.json`
  (`pcp_core.program.export_cache`);
- an `xla` worker's compiled steps, jax's persistent compilation cache in `xla/`
  (`pcp_xla.executor.keep_compiled_steps`), and XLA's autotuning results below it.

An entry is code that runs, and its key is computable by anyone, so the directory is
trusted only as far as it is private: it is created 0700 and used only while it belongs
to this user and no one else can write to it. Otherwise PCP compiles without it and
says why in a warning: the cache only saves time, and a run should not stop over it.

It is kept under a size (`PCP_CACHE_MAX_GB`, default 10): after PCP writes an entry,
and after an `xla` worker compiles, the least recently used entries are removed until
the rest fit. PCP marks each use of its own entries; jax's are read without a mark, so
for them the files' access time counts (Linux's default, relatime, notes the first read
after a write and then one a day; a disk mounted noatime notes none). Only files named
as PCP and jax name theirs are counted or removed: `shards/`, where workers keep the
dataset shards they fetch, is not.
"""

import contextlib
import dataclasses
import functools
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
# what `pcp cache` calls each kind of entry
XLA_EXECUTABLES = "XLA executables"
XLA_AUTOTUNING_RESULTS = "XLA autotuning results"
JAX_KINDS = (XLA_EXECUTABLES, XLA_AUTOTUNING_RESULTS)
INCOMPLETE = "incomplete entries"  # half-written files (by PCP or XLA's autotuner)
# PCP's files: <key>.vmfb and <key>.json (an IREE module and its digest), <key>.mlir and
# <key>.mlir.json (an exported program and its digest), and their half-written forms
PCP_FILE = re.compile(r"([0-9a-f]{64})(\.vmfb|\.json|\.mlir|\.mlir\.json)(\.[a-z0-9_]+\.partial)?")
PCP_KINDS = {
    ".vmfb": "IREE modules",
    ".json": "IREE modules",
    ".mlir": "exported programs",
    ".mlir.json": "exported programs",
}
JAX_FILE = re.compile(r"(.+)-(?:cache|atime)")  # jax's LRU cache: <name>-cache, <name>-atime
XLA_DIRECTORY = "xla"
XLA_AUTOTUNING = "xla_gpu_per_fusion_autotune_cache_dir"  # jax puts it in its cache dir
AUTOTUNING_FILE = re.compile(r"[A-Za-z0-9_-]+\.(?:pb|textproto)")  # a hash, base64 or hex
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


def store(directory: Path, files: list[tuple[str, bytes]]) -> None:
    """Write an entry's files into `directory` in order, each whole or not at all, the
    last one (its digest) marking the entry whole; then trim the cache to its limit. A
    disk that refuses the write is warned about: the cache only saves time."""
    try:
        for name, data in files:
            _write_atomically(directory / name, data)
    except OSError as error:
        log.warning("could not write to the compile cache", path=str(directory), reason=str(error))
        return
    trim(directory)


def _write_atomically(path: Path, data: bytes) -> None:
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
    """The files of one cached program or autotuning result, and when it was last used."""

    kind: str
    files: list[Path]
    size: int
    last_used: float


def mark_used(path: Path) -> None:
    """Note that PCP read the entry `path` belongs to now, so trimming keeps it longer
    (on any file system: access times are not kept where it is mounted noatime)."""
    with contextlib.suppress(OSError):  # only the order of eviction depends on it
        os.utime(path)


def entries(directory: Path) -> list[Entry]:
    """The entries in `directory`, least recently used first. A half-written file is
    left out unless a crash left it long ago."""
    now = time.time()
    groups: dict[tuple[str, str], list[tuple[Path, os.stat_result]]] = {}
    for group, path in _cache_files(directory):
        try:
            info = path.lstat()
        except OSError:
            continue  # removed meanwhile by another process
        if group[0] == INCOMPLETE and now - info.st_mtime < PARTIAL_LEFTOVER_S:
            continue  # being written
        groups.setdefault(group, []).append((path, info))
    found = [
        Entry(
            kind=kind,
            files=sorted(path for path, _ in files),
            size=sum(info.st_size for _, info in files),
            last_used=max(_last_used(kind, info) for _, info in files),
        )
        for (kind, _), files in groups.items()
    ]
    return sorted(found, key=lambda entry: entry.last_used)


def _last_used(kind: str, info: os.stat_result) -> float:
    """When a file was last used: PCP marks its own files' use (`mark_used`), while jax
    reads its files without a mark, so for them the access time counts as well."""
    return max(info.st_mtime, info.st_atime) if kind in JAX_KINDS else info.st_mtime


def _cache_files(directory: Path) -> Iterator[tuple[tuple[str, str], Path]]:
    """Each file of the cache with its entry's (kind, name): PCP's files named by their
    keys, jax's executables in `xla/`, and XLA's autotuning results in their folder or,
    from jax 0.11, in a folder below it for each kind of device. Nothing else that may
    be there (where `PCP_CACHE_DIR` names a folder in use), and no link followed."""
    for path in _plain_files(directory):
        if match := PCP_FILE.fullmatch(path.name):
            key, suffix, partial = match.groups()
            yield (INCOMPLETE if partial else PCP_KINDS[suffix], key), path
    xla = directory / XLA_DIRECTORY
    if xla.is_symlink():  # not the folder PCP made, and what it leads to is not PCP's
        return
    for path in _plain_files(xla):
        if match := JAX_FILE.fullmatch(path.name):
            yield (XLA_EXECUTABLES, match.group(1)), path
    autotuning = xla / XLA_AUTOTUNING
    folders = [autotuning, *_plain_folders(autotuning)]  # from jax 0.11, one a device kind
    # XLA writes each result in a tmp/ first, then renames it into place
    folders += [folder / "tmp" for folder in folders[1:] if folder.name != "tmp"]
    for folder in folders:
        for path in _plain_files(folder):
            name = str(path.relative_to(autotuning))
            if folder.name == "tmp":
                yield (INCOMPLETE, name), path
            elif AUTOTUNING_FILE.fullmatch(path.name):
                yield (XLA_AUTOTUNING_RESULTS, name), path


def _plain_files(directory: Path) -> Iterator[Path]:
    """The regular files in `directory`, if it is a folder and not a link to one."""
    return (Path(item.path) for item in _scan(directory) if item.is_file(follow_symlinks=False))


def _plain_folders(directory: Path) -> Iterator[Path]:
    """The folders in `directory` that are not links, if it is a folder and not a link."""
    return (Path(item.path) for item in _scan(directory) if item.is_dir(follow_symlinks=False))


def _scan(directory: Path) -> list[os.DirEntry[str]]:
    """What `directory` holds; nothing if it is no folder, or a link to one."""
    if directory.is_symlink() or not directory.is_dir():
        return []
    try:
        with os.scandir(directory) as found:
            return list(found)
    except OSError:
        return []


def max_bytes() -> int:
    """The cache's size limit: `PCP_CACHE_MAX_GB` (a number of GB, 0 or more), else
    `DEFAULT_MAX_GB`."""
    return _limit(os.environ.get("PCP_CACHE_MAX_GB", ""))


@functools.cache
def _limit(text: str) -> int:
    """`text` GB in bytes; `DEFAULT_MAX_GB` for no text, and for one that is no number of
    GB, with a warning (once: it is read after every write)."""
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
    `max_bytes()`; the entries removed. Another process may be reading an entry: it gets
    the whole entry or a miss, and compiles again. An entry that cannot be removed (a file
    of another user's, a read-only disk) is passed over with a warning: the cache only
    saves time."""
    limit = max_bytes()
    removed, failures = remove_until(directory, limit)
    if failures:
        log.warning(
            "could not remove some of the compile cache's entries; passing them over",
            path=str(directory),
            entries=len(failures),
            first=failures[0],
        )
    if removed:
        log.info(
            "compile cache trimmed to its size limit",
            path=str(directory),
            removed=len(removed),
            freed_mb=round(sum(e.size for e in removed) / 1e6, 1),
            limit_mb=round(limit / 1e6, 1),
        )
    return removed


def remove_until(directory: Path, limit: int) -> tuple[list[Entry], list[str]]:
    """Remove entries of `directory`, least recently used first, until the rest take at
    most `limit` bytes; the entries removed, and why each one passed over could not be."""
    found = entries(directory)
    total = sum(entry.size for entry in found)
    removed, failures = [], []
    for entry in found:
        if total <= limit:
            break
        failure = remove(entry)
        if failure:
            failures.append(failure)
            continue
        removed.append(entry)
        total -= entry.size
    return removed, failures


def remove(entry: Entry) -> str | None:
    """Delete the entry's files, the one that marks it whole (a digest, jax's access time)
    last, so that a reader finds it whole or not at all; why not, where a file could not
    be deleted. Files another process removed meanwhile are gone as well."""
    for path in sorted(entry.files, key=lambda path: path.name.endswith((".json", "-atime"))):
        try:
            path.unlink(missing_ok=True)
        except OSError as error:
            return f"{path}: {error.strerror or error}"
    return None
