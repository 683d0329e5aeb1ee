"""How big a model is and roughly how much memory one training step needs, before it runs.

So a user learns that `--model-size gpt2-medium --batch-size 64` cannot fit their
device before compiling it. The parameter count is exact (from the parameters'
shapes, without making them). The memory is an *estimate* for one device training in
float32 with AdamW:

- weights and gradients: 4 bytes per parameter each;
- optimizer state: the program's own state tensors where known, else AdamW's two
  moments (8 bytes per parameter);
- activations kept for the backward pass of one step (the K steps of a call run one
  after another, so only one step's are alive), for GPT-shaped configs (`n_layer`,
  `n_head`, `n_embd`, `block_size`, `vocab_size`), in float32 floats:

      per layer   batch * block * (16 * n_embd + 2 * n_head * block)
      logits      batch * block * vocab_size * 4

  Per position and layer, 16 widths: the two norms' inputs and outputs, q, k, v, the
  attention output, the MLP's 4-wide hidden before and after GELU; and per head two
  block-long rows: the attention scores and their softmax (Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", without dropout).
  The logits term counts the logits, the loss's softmax, their gradient and the
  embedding gradient's one-hot matrix. bf16 runs keep float32 activations (products
  accumulate in float32), so the same figure holds. With `remat` (`--remat blocks`) a
  layer keeps only its input, `batch * block * n_embd`, and one layer's activations are
  alive at a time while the backward pass recomputes them: where the compiler keeps the
  recomputation apart (XLA's CPU compiler merges it back; docs/gpu.md).

Left out: the compiler's scratch space and what fusion saves, the runtime's own memory,
the token batches. Read it as the order of magnitude, not a limit.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pcp_core.models import Model

FLOAT_BYTES = 4
GPT_SETTINGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


@dataclass(frozen=True)
class Footprint:
    """A model's parameter count and the estimated bytes of one training step."""

    parameters: int
    weight_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int | None  # None: not a config the formula knows
    batch_size: int

    @property
    def total_bytes(self) -> int:
        parts = (self.weight_bytes, self.gradient_bytes, self.optimizer_bytes)
        return sum(parts) + (self.activation_bytes or 0)

    def describe(self) -> str:
        """One line, e.g. "124.4M parameters, ~41.1 GiB (weights 474.7 MiB, ...)"."""
        return f"{human_count(self.parameters)} parameters, {self.describe_memory()}"

    def describe_memory(self) -> str:
        """The total and its parts, e.g. "~41.1 GiB (weights 474.7 MiB, ...)"."""
        activations = (
            "activations not estimated"
            if self.activation_bytes is None
            else f"activations ~{human_bytes(self.activation_bytes)} at batch {self.batch_size}"
        )
        return (
            f"~{human_bytes(self.total_bytes)} (weights {human_bytes(self.weight_bytes)}, "
            f"gradients {human_bytes(self.gradient_bytes)}, optimizer state "
            f"{human_bytes(self.optimizer_bytes)}, {activations})"
        )

    def to_dict(self) -> dict[str, int | None]:
        """The estimate in bytes, for summary.json."""
        return {
            "weights_bytes": self.weight_bytes,
            "gradients_bytes": self.gradient_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "activations_bytes": self.activation_bytes,
            "total_bytes": self.total_bytes,
            "batch_size": self.batch_size,
        }


def parameter_shapes(model: Model, model_config: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """The model's parameters' shapes by name, in order, made only where the model has no
    `shapes` (then `init` runs under `jax.eval_shape`, which allocates only for an init
    written in NumPy)."""
    if model.shapes is not None:
        return dict(model.shapes(model_config))
    import jax

    made = jax.eval_shape(lambda: model.init(model_config, 0))
    return {name: tuple(leaf.shape) for name, leaf in made.items()}


def activation_floats(model_config: Mapping[str, Any], batch_size: int) -> int | None:
    """The float32 activations one GPT step keeps for its backward pass (module docstring);
    None for a config without the GPT settings."""
    if not all(key in model_config for key in GPT_SETTINGS):
        return None
    layers, heads, width, block, vocab = (int(model_config[key]) for key in GPT_SETTINGS)
    positions = batch_size * block
    per_layer = positions * (16 * width + 2 * heads * block)
    if model_config.get("remat"):  # each layer's input, and one layer's activations at a time
        return layers * positions * width + per_layer + positions * vocab * 4
    return layers * per_layer + positions * vocab * 4


def estimate(
    shapes: Iterable[tuple[int, ...]],
    model_config: Mapping[str, Any],
    batch_size: int,
    optimizer_bytes: int | None = None,
) -> Footprint:
    """The footprint of float32 parameters of `shapes` trained at `batch_size`;
    `optimizer_bytes` defaults to AdamW's two moments."""
    parameters = sum(int(np.prod(shape, dtype=np.int64)) for shape in shapes)
    weights = parameters * FLOAT_BYTES
    activations = activation_floats(model_config, batch_size)
    return Footprint(
        parameters=parameters,
        weight_bytes=weights,
        gradient_bytes=weights,
        optimizer_bytes=2 * weights if optimizer_bytes is None else optimizer_bytes,
        activation_bytes=None if activations is None else activations * FLOAT_BYTES,
        batch_size=batch_size,
    )


def human_count(count: int) -> str:
    """124439808 -> "124.4M"."""
    for divisor, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if count >= divisor:
            return f"{count / divisor:.1f}{unit}"
    return str(count)


def human_bytes(count: int) -> str:
    """2254857830 -> "2.1 GiB"."""
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if count >= 1024**power:
            return f"{count / 1024**power:.1f} {unit}"
    return f"{count} B"
