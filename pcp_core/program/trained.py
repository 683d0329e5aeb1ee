"""A run's trained model, as `pcp sample` and `pcp export` read it from its run directory.

The model comes back from the run's newest intact checkpoint: its name and config in
the metadata (rebuilt through the plugin registry, as training does), its parameters in
the model's order, and the tokenizer it trained with.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pcp_core.data import tokenizers
from pcp_core.models import Model, Params
from pcp_core.program import checkpoint
from pcp_core.program.footprint import parameter_shapes

CHECKPOINT = "checkpoint.safetensors"


class TrainedModelError(ValueError):
    """A run directory without a model to use (no checkpoint, no tokenizer, no logits)."""


@dataclass(frozen=True)
class TrainedModel:
    """A run's model with its config, parameters, tokenizer and checkpoint metadata."""

    model: Model
    config: dict[str, int]
    params: Params
    tokenizer: Any
    metadata: dict[str, str]


class ModelLookup(Protocol):
    """Where models are found by name: the run's plugin host."""

    def model(self, name: str) -> Model: ...


def load(run_dir: Path, plugins: ModelLookup) -> TrainedModel:
    """The model saved in `run_dir`'s newest intact checkpoint (`plugins` finds it by
    the name the checkpoint records)."""
    tensors, metadata = load_checkpoint(Path(run_dir))
    tokenizer = checkpoint_tokenizer(metadata)
    model: Model = plugins.model(metadata["model"])
    config = json.loads(metadata["model_config"])
    params = checkpoint_params(model, config, tensors)
    return TrainedModel(model, config, params, tokenizer, metadata)


def load_checkpoint(run_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The run's newest intact checkpoint (see `checkpoint.load_latest`)."""
    if not run_dir.is_dir():
        raise TrainedModelError(f"{run_dir}: no such run directory")
    path = run_dir / CHECKPOINT
    if not (path.exists() or checkpoint.previous_path(path).exists()):
        raise TrainedModelError(f"{run_dir}: no checkpoint ({CHECKPOINT}); has the run saved one?")
    tensors, metadata = checkpoint.load_latest(path)
    missing = [key for key in ("model", "model_config") if key not in metadata]
    if missing:
        raise TrainedModelError(f"{path}: not a model checkpoint (no {', '.join(missing)})")
    return tensors, metadata


def checkpoint_tokenizer(metadata: Mapping[str, str]) -> Any:
    """The tokenizer the run trained with; from its vocabulary for older checkpoints."""
    if "tokenizer" in metadata:
        return tokenizers.from_json(metadata["tokenizer"])
    if "vocabulary" in metadata:
        return tokenizers.CharTokenizer(metadata["vocabulary"])
    raise TrainedModelError("the checkpoint records no tokenizer, so its tokens cannot be read")


def checkpoint_params(
    model: Model, model_config: Mapping[str, int], tensors: Mapping[str, np.ndarray]
) -> Params:
    """The model's parameters, in its order, from the checkpoint's tensors."""
    if model.logits is None:
        raise TrainedModelError(f"model {model.name!r} has no logits function to sample or export")
    params: Params = {}
    for name, shape in parameter_shapes(model, model_config).items():
        if name not in tensors or tensors[name].shape != tuple(shape):
            raise TrainedModelError(f"the checkpoint's {name!r} does not fit model {model.name!r}")
        params[name] = tensors[name]
    return params
