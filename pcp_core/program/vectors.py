"""A model's vectors (biases, norms' weights) as one tensor inside a train step.

XLA on a GPU gives each parameter its own update kernel and its own sum for the
clipping norm. GPT-2 small has 98 vectors of 768-3072 values: about 200 kernels a
step, each one a launch and a gap for a few thousand values. Joined into one vector
for the K steps of a call, they take one of each. The call's inputs and outputs stay
tensor by tensor; the join is after the inputs are read and the split before the
outputs are written, once a call.

Only for an optimizer that declares it treats each value on its own
(`pcp_core.optimizers.ElementwiseTransformation`): one with a per-tensor statistic
would compute another update for the joined vector.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pcp_core.optimizers import ElementwiseTransformation
from pcp_core.program.mesh import export_mesh

# Platforms whose exported program joins the vectors (see `VectorGroup`). On an H200,
# GPT-2 small bf16, batch 16: benchmarks/results/gpu/h200/2026-11-29-grouped.
GROUPED_PLATFORMS: tuple[str, ...] = ("cuda",)
# The joined vector's key among the parameters (no model's parameter is so named).
GROUP_KEY = "(vectors)"


@dataclass(frozen=True)
class VectorGroup:
    """Which parameters are joined, in the order they are joined, and their lengths."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    def join(self, tree: Any) -> Any:
        """`tree` (the parameters, gradients, or an optimizer state holding trees like
        them) with each parameter-like dict's vectors joined under `GROUP_KEY`."""
        import jax.numpy as jnp

        def joined(named: dict[str, Any]) -> dict[str, Any]:
            rest = {n: v for n, v in named.items() if n not in self.names}
            return rest | {GROUP_KEY: jnp.concatenate([named[n] for n in self.names])}

        return self._each_parameter_dict(tree, joined, set(self.names))

    def split(self, tree: Any) -> Any:
        """`join`'s inverse."""
        from jax import lax

        def split(named: dict[str, Any]) -> dict[str, Any]:
            rest = {n: v for n, v in named.items() if n != GROUP_KEY}
            pieces = lax.split(named[GROUP_KEY], self.sizes)
            return rest | dict(zip(self.names, pieces, strict=True))

        return self._each_parameter_dict(tree, split, {GROUP_KEY})

    def _each_parameter_dict(self, tree: Any, change: Any, marker: set[str]) -> Any:
        import jax

        def parameter_dict(node: Any) -> bool:
            return isinstance(node, dict) and marker <= set(node)

        return jax.tree_util.tree_map(
            lambda node: change(node) if parameter_dict(node) else node,
            tree,
            is_leaf=parameter_dict,
        )


def vector_group(
    platform: str | None, optimizer: Any, params: Mapping[str, Any]
) -> VectorGroup | None:
    """The group to join in a step exported for `platform` on one device, or None: the
    platform is not in `GROUPED_PLATFORMS`, the optimizer is not elementwise, the step
    is for several devices (each optimizer-state tensor is split over them), or the
    model has fewer than two float32 vectors."""
    if platform not in GROUPED_PLATFORMS or export_mesh() is not None:
        return None
    if not isinstance(optimizer, ElementwiseTransformation):
        return None
    vectors = {n: p for n, p in params.items() if p.ndim == 1 and str(p.dtype) == "float32"}
    if len(vectors) < 2:
        return None
    return VectorGroup(tuple(vectors), tuple(int(p.shape[0]) for p in vectors.values()))
