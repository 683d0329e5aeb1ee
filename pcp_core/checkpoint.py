"""Checkpoints in safetensors format, written so that a crash never costs the last good one.

`save` writes a temp file, fsyncs it, moves the current checkpoint aside to
`*-previous.safetensors` and renames the new one into place, then fsyncs the directory.
A SHA-256 of the tensors' bytes rides in the metadata. `load_latest` checks it and
falls back to the previous checkpoint when the newest is missing, truncated or corrupt.
"""

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import structlog

log = structlog.get_logger(__name__)


class CheckpointError(RuntimeError):
    """No intact checkpoint to resume from."""


def previous_path(path: Path) -> Path:
    return path.with_name(path.stem + "-previous" + path.suffix)


def _digest(tensors: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode() + b"\0")
        digest.update(np.ascontiguousarray(tensors[name]).tobytes())
    return digest.hexdigest()


def save(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, Any]) -> None:
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    text_metadata = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    save_file(tensors, partial, text_metadata | {"sha256": _digest(tensors)})
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


def load(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A checkpoint's tensors and metadata; CheckpointError if it is damaged."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
            metadata = dict(handle.metadata() or {})
    except (OSError, SafetensorError) as error:
        raise CheckpointError(f"{path}: unreadable: {error}") from error
    expected = metadata.get("sha256")
    if expected is not None and _digest(tensors) != expected:
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
