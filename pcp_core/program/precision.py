"""Mixed precision for the train program: which dtype matrix products take their inputs in.

`f32` computes everything in float32. `bf16` feeds every matrix product bfloat16
inputs and accumulates in float32; master weights, optimizer state, reductions,
softmax and the pseudo-gradients on the wire stay float32. The policy is written into
the program itself (casts and a hand-written gradient), so IREE on every target and
XLA compute the same thing, and no backend needs a precision flag.
"""

import functools
from typing import Any

from pcp_core.program.platform_export import xla_on_cuda

# Blocks of rows whose weight-gradient products are summed last (see `weight_gradient`).
WEIGHT_GRADIENT_BLOCKS = 8


def matmul(a: Any, b: Any, precision: str, bf16_out: bool = False) -> Any:
    """`a @ b` (b either 2-D or batched like a) under the precision policy, in float32
    (in bf16 where the caller asks for `bf16_out`)."""
    return _matmul(precision, bf16_out)(a, b)


def bf16_hidden(precision: str) -> bool:
    """Whether the MLP's hidden activation is bf16 in the program being traced: under
    `bf16` in the export for XLA on CUDA.

    There `c_fc` rounds its output (bias added in float32) once, GELU reads and writes
    bf16, and the gradients that flow back through them are bf16 too (GELU's derivative
    itself is computed in float32). The backward pass reads that activation in bf16 in
    every program (see `stored`); this also rounds the forward GELU's input and the
    hidden gradient, so the widest activation of the step takes half the bytes.
    """
    return precision == "bf16" and xla_on_cuda()


def weight_gradient(a: Any, g: Any, precision: str) -> Any:
    """aᵀ·g summed over every row: the gradient of a weight that all rows share.

    The rows (batch × time, thousands) are the long reduction, and the result is small,
    so as one product a GPU gets a handful of workgroups that each walk every row: IREE
    ran the 384x384 and vocabulary-sized ones at 0.1-4 TFLOP/s. As a batch of products
    over blocks of rows, summed afterwards, it gets `WEIGHT_GRADIENT_BLOCKS` times the
    parallel work for one extra pass over a weight-sized result. XLA on CUDA takes one
    product: cuBLAS splits the long reduction itself, and the blocks' partial sums would
    be written and read back (for a vocabulary-sized weight, a pass of its own).
    """
    import jax.numpy as jnp

    a, g = a.reshape(-1, a.shape[-1]), g.reshape(-1, g.shape[-1])
    rows = a.shape[0]
    blocks = WEIGHT_GRADIENT_BLOCKS if rows % WEIGHT_GRADIENT_BLOCKS == 0 else 1
    a, g = _cast(a, precision), _cast(g, precision)
    if xla_on_cuda():
        return _product(a.T, g)
    a_blocks = jnp.swapaxes(a.reshape(blocks, rows // blocks, -1), 1, 2)
    partial = _product(a_blocks, g.reshape(blocks, rows // blocks, -1))
    return partial.sum(axis=0)


def stored(x: Any, precision: str) -> Any:
    """`x` as the backward pass keeps it: in the dtype products take their inputs in.

    Under `bf16` an activation kept for the gradient (an MLP's pre-activation) is
    rounded as a product's input would be, halving the bytes written forward and read
    back; the gradient arithmetic stays float32.
    """
    return _cast(x, precision)


def _cast(x: Any, precision: str) -> Any:
    import jax.numpy as jnp

    return x.astype(jnp.bfloat16) if precision == "bf16" else x


def _product(a: Any, b: Any) -> Any:
    import jax.numpy as jnp

    return jnp.matmul(a, b, preferred_element_type=jnp.float32)


@functools.cache
def _matmul(precision: str, bf16_out: bool = False):
    """`a @ b` with inputs in the policy's dtype, f32 accumulation, and a hand-written
    gradient whose products take the same inputs.

    Autodiff of a cast-then-multiply would run the two backward products with a float32
    cotangent, that is in float32: the slow two thirds of the work. Here the cotangent
    is rounded to bf16 before each, as mixed-precision training does. A 2-D `b` is a
    weight shared by every row of `a`; its gradient is `weight_gradient`. With
    `bf16_out` the product rounds its output to bf16, and `a`'s gradient comes back in
    `a`'s own dtype.
    """
    import jax
    import jax.numpy as jnp

    def forward(a, b):
        if bf16_out:
            marker = jnp.zeros((0,), a.dtype)  # a's dtype, for its gradient
            a, b = _cast(a, precision), _cast(b, precision)
            return jnp.matmul(a, b, preferred_element_type=jnp.bfloat16), (a, b, marker)
        a, b = _cast(a, precision), _cast(b, precision)
        return _product(a, b), (a, b)

    def backward(residuals, g):
        a, b = residuals[:2]
        grad_a = _product(_cast(g, precision), jax.numpy.swapaxes(b, -1, -2))
        if bf16_out:
            grad_a = grad_a.astype(residuals[2].dtype)
        if b.ndim == 2:
            return grad_a, weight_gradient(a, g, precision)
        return grad_a, _product(jax.numpy.swapaxes(a, -1, -2), _cast(g, precision))

    product = jax.custom_vjp(lambda a, b: forward(a, b)[0])
    product.defvjp(forward, backward)
    return product
