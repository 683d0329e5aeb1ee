"""Causal self-attention in the portable form: IREE's programs, the CPU's and XLA's
float32 program, which have no fused attention with a backward pass.

The float32 [time, time] scores are the step's largest tensors, and the causal mask
zeroes half of them. So the queries go in blocks, each block against only the keys up
to its last query: at 1024 positions two blocks of 512 compute 3/4 of the square, with
the same arithmetic. Side by side with the whole square at 1024 positions, IREE's step
took 2.9% less on an H200 (GPT-2 small bf16) and 14-25% less on a 2-core CPU; blocks of
256 gain more on the CPU but cost the GPU 2-3% in more, smaller launches
(benchmarks/attention_blocks.py, docs/iree-cuda.md).
"""

import math
from typing import Any

from pcp_core.program import precision as precisions

QUERY_BLOCK = 512  # a context up to this is one block: the whole square


def causal_attention(q, k, v, precision: str):
    """softmax(q·kᵀ/√d)·v, causal, of [batch, heads, time, head width] q, k, v, each
    `QUERY_BLOCK` queries (the last block may be shorter) against the keys up to the last."""
    import jax
    import jax.numpy as jnp

    keys_t = k.transpose(0, 1, 3, 2)
    scale = 1.0 / math.sqrt(q.shape[3])
    outs = []
    for start, end in query_blocks(q.shape[2]):
        scores = precisions.matmul(q[:, :, start:end], keys_t[..., :end], precision)
        scores = scores.astype(jnp.float32) * scale
        causal = jnp.tril(jnp.ones((end - start, end), dtype=bool), k=start)
        scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
        outs.append(precisions.matmul(jax.nn.softmax(scores, axis=-1), v[:, :, :end], precision))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)


def query_blocks(time) -> list[tuple[int, Any]]:
    """[start, end) of each block of queries; one block where `time` is symbolic (an
    export with a dynamic time axis), whose blocks are not known when it is traced."""
    if not isinstance(time, int):
        return [(0, time)]
    return [(start, min(start + QUERY_BLOCK, time)) for start in range(0, time, QUERY_BLOCK)]
