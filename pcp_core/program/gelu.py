"""GELU (the tanh approximation: GPT-2's, jax.nn.gelu's) with hand-written gradients
that keep only its input, and the MLP's first layer and GELU as one for XLA on CUDA.
tests/test_nanogpt_gradients.py checks them against autodiff.
"""

import functools
import math

from pcp_core.program import precision as precisions
from pcp_core.program.layers import column_sum
from pcp_core.program.platform_export import xla_on_cuda

GELU_C = math.sqrt(2 / math.pi)  # GELU's tanh approximation (GPT-2's, jax.nn.gelu's)


@functools.cache
def gelu(precision: str):
    """GELU (tanh approximation) that keeps only its input for the backward pass.

    Autodiff of `jax.nn.gelu` kept x², tanh(·) and 0.5·(1 + tanh(·)) as well: IREE's MLP
    product wrote four float32 [tokens, 4·width] tensors and the backward pass read them
    back. The derivative is recomputed from x instead, elementwise in the pass that
    uses it; x is kept in the precision policy's dtype (bf16 under `bf16`, as the
    product that made it would store it). XLA on CUDA gets x from behind an optimization
    barrier: else XLA merges the recomputation with the forward's (the same ops on the
    same input) and keeps its tanh or σ for the backward pass in float32, twice the
    bytes of the bf16 input it would recompute from.
    """
    import jax

    def backward(x, g):
        if xla_on_cuda():
            x = jax.lax.optimization_barrier(x)
        return ((g * gelu_slope(x)).astype(g.dtype),)

    gelu = jax.custom_vjp(gelu_value)
    gelu.defvjp(lambda x: (gelu_value(x), precisions.stored(x, precision)), backward)
    return gelu


def gelu_value(x):
    """GELU of `x` computed in float32, in `x`'s dtype.

    XLA on CUDA computes 0.5·x·(1 + tanh(u)) as x·σ(2u), the same function: an exp and a
    division per element, where XLA's float32 tanh is a clamped rational polynomial and
    a division, and the GELU passes are bound by that arithmetic, not by their bytes.
    """
    import jax.numpy as jnp

    y = x.astype(jnp.float32)  # (a bf16 product's output is computed in float32)
    u = GELU_C * (y + 0.044715 * (y * y * y))
    if xla_on_cuda():
        return (y / (1.0 + jnp.exp(-2.0 * u))).astype(x.dtype)
    return (0.5 * y * (1.0 + jnp.tanh(u))).astype(x.dtype)


def gelu_slope(x):
    """GELU's derivative at `x`, in float32."""
    import jax.numpy as jnp

    x = x.astype(jnp.float32)
    u = GELU_C * (x + 0.044715 * (x * x * x))
    du = GELU_C * (1.0 + 3 * 0.044715 * x * x)
    if xla_on_cuda():
        s = 1.0 / (1.0 + jnp.exp(-2.0 * u))  # σ(2u) = 0.5(1 + tanh(u))
        return s + 2.0 * x * s * (1.0 - s) * du
    t = jnp.tanh(u)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du


@functools.cache
def dense_gelu(precision: str, in_dtype: str):
    """`gelu(x @ weight + bias)` in bf16, as `rounded_dense` (bf16 product output, bias
    added in bf16) then `gelu` compute it, keeping the product's output for the backward
    pass rather than the sum with the bias: the MLP's first layer in the export for XLA
    on CUDA, whose hidden activation is bf16 (`precision.bf16_hidden`).

    cuBLAS writes the product; the forward pass adds the bias and applies GELU in one
    pass that writes only GELU's output, and the backward pass adds the bias again where
    it reads the product. Kept apart, XLA's GELU pass wrote the sum with the bias as a
    second [tokens, 4 · width] output for the backward pass to read.
    """
    import jax
    import jax.numpy as jnp

    def forward(x, weight, bias):
        x, weight = precisions.stored(x, precision), precisions.stored(weight, precision)
        z = jnp.matmul(x, weight, preferred_element_type=jnp.bfloat16)
        return gelu_value(z + bias.astype(jnp.bfloat16)), (x, weight, z, bias)

    def backward(residuals, g):
        x, weight, z, bias = residuals
        z = jax.lax.optimization_barrier(z)  # not the forward's sum with the bias
        g_y = (g * gelu_slope(z + bias.astype(jnp.bfloat16))).astype(jnp.bfloat16)
        grad_x = jnp.matmul(g_y, weight.T, preferred_element_type=jnp.float32).astype(in_dtype)
        grad_weight = precisions.weight_gradient(x, g_y, precision)
        return grad_x, grad_weight, column_sum(g_y.astype(jnp.float32))

    dense = jax.custom_vjp(lambda x, weight, bias: forward(x, weight, bias)[0])
    dense.defvjp(forward, backward)
    return dense
