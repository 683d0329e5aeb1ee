"""Checkpoints in safetensors format, written atomically so a crash never leaves half a file."""

import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def save(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, Any]) -> None:
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    text_metadata = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, partial, text_metadata)
    partial.replace(path)


def load(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        return tensors, dict(handle.metadata() or {})
