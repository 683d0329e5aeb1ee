"""Checkpoints in safetensors format, written so that a crash never costs the last good one.

`save` writes a temp file, fsyncs it, moves the current checkpoint aside to
`*-previous.safetensors` and renames the new one into place, then fsyncs the directory.
A write that fails (no space, no permission) removes its temp file, leaves both earlier
checkpoints as they were, and raises CheckpointWriteError: one line saying why.

A SHA-256 over the tensors' bytes and every metadata entry rides in the metadata
("checksum"), so a changed bit in the round to resume from is caught as surely as one in
a tensor. `load_latest` checks it and falls back to the previous checkpoint when the
newest is missing, truncated or corrupt. Checkpoints from before the metadata was
covered carry "sha256", over the tensors alone, and still load.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import structlog

log = structlog.get_logger(__name__)

CHECKSUM = "checksum"  # over tensors and metadata
TENSORS_ONLY = "sha256"  # the older checksum, over the tensors alone


class CheckpointError(RuntimeError):
    """No intact checkpoint to resume from."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the earlier ones are untouched."""


def previous_path(path: Path) -> Path:
    return path.with_name(path.stem + "-previous" + path.suffix)


def _digest(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode() + b"\0")
        # the bytes in place, not a copy (hashlib lets other threads run while it reads)
        digest.update(np.ascontiguousarray(tensors[name]).reshape(-1).view(np.uint8).data)
    if metadata is not None:
        digest.update(b"\0metadata\0")
        digest.update(json.dumps(metadata, sort_keys=True).encode())
    return digest.hexdigest()


def save(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, Any]) -> None:
    from safetensors.numpy import save_file

    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    text_metadata = {
        k: v if isinstance(v, str) else json.dumps(v)
        for k, v in metadata.items()
        if k not in (CHECKSUM, TENSORS_ONLY)
    }
    text_metadata[CHECKSUM] = _digest(tensors, text_metadata)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, partial, text_metadata)
        with partial.open("rb") as written:
            os.fsync(written.fileno())
        if path.exists():
            path.replace(previous_path(path))
        partial.replace(path)
        descriptor = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except Exception as error:  # safetensors reports a full disk as its own error type
        partial.unlink(missing_ok=True)
        why = getattr(error, "strerror", None) or str(error).splitlines()[0]
        raise CheckpointWriteError(f"cannot write the checkpoint {path}: {why}") from error


def load(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A checkpoint's tensors and metadata; CheckpointError if it is damaged."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
            metadata = dict(handle.metadata() or {})
    except (OSError, SafetensorError) as error:
        raise CheckpointError(f"{path}: unreadable: {error}") from error
    if CHECKSUM in metadata:
        covered = {k: v for k, v in metadata.items() if k != CHECKSUM}
        intact = _digest(tensors, covered) == metadata[CHECKSUM]
    else:
        intact = TENSORS_ONLY not in metadata or _digest(tensors) == metadata[TENSORS_ONLY]
    if not intact:
        raise CheckpointError(f"{path}: checksum mismatch, the file is corrupt")
    return tensors, metadata


def load_latest(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The newest intact of `path` and its previous copy."""
    problems = []
    for candidate in (path, previous_path(path)):
        if not candidate.exists():
            problems.append(f"{candidate.name}: missing")
            continue
        try:
            loaded = load(candidate)
        except CheckpointError as error:
            log.warning("checkpoint damaged; trying the previous one", error=str(error))
            problems.append(str(error))
            continue
        return loaded
    raise CheckpointError(f"no intact checkpoint in {path.parent}: " + "; ".join(problems))


KEPT_FOLDER = "checkpoints"  # beside the rolling checkpoint: those --save-every keeps


def keep_copy(path: Path, step: int, keep: int) -> Path:
    """The checkpoint just written at `path`, kept as checkpoints/step-N.safetensors (a
    hard link where the file system allows: the rolling file's later renames leave it
    be); then only the newest `keep` of those (0: all)."""
    folder = path.parent / KEPT_FOLDER
    folder.mkdir(exist_ok=True)
    kept = folder / f"step-{step:09d}.safetensors"
    kept.unlink(missing_ok=True)
    try:
        os.link(path, kept)
    except OSError:
        shutil.copy2(path, kept)
    log.info("checkpoint kept", path=str(kept))
    if keep:
        for old in sorted(folder.glob("step-*.safetensors"))[:-keep]:
            old.unlink(missing_ok=True)
    return kept
