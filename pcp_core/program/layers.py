"""The built-in model's layers with hand-written gradients.

Each keeps fewer tensors for the backward pass than autodiff would, or computes its
gradient in a form the compilers run well: IREE on GPUs, and XLA in the export for XLA
on CUDA (`platform_export.xla_on_cuda`), whose forms each docstring gives with its
reason. `pcp_core.program.nanogpt` builds the model from them;
tests/test_nanogpt_gradients.py checks each against autodiff.
"""

import functools
import operator

from pcp_core.program import precision as precisions
from pcp_core.program.platform_export import xla_on_cuda

# Rows that each stage of `column_sum` adds together, and the most left for its last sum.
COLUMN_SUM_FOLD = 64
COLUMN_SUM_LAST = 128


def column_sum(g):
    """The sum of `g` over every axis but the last, as folds of the leading axis.

    This is the gradient of every broadcast bias and norm weight. Each stage views the
    rows as [fold, rows/fold · width] and adds along the leading axis, so every GPU
    thread owns outputs and a warp reads neighbouring elements. Summed along the rows
    (or in contiguous blocks of rows), IREE gave each output a warp of its own reading
    one column with a stride of the width, several times slower than its bytes allow.
    XLA on CUDA takes a plain sum, which it fuses with the pass that makes `g`.
    """
    width = g.shape[-1]
    if xla_on_cuda():
        return g.reshape(-1, width).sum(axis=0)
    flat = g.reshape(-1)
    while flat.size // width > COLUMN_SUM_LAST and (flat.size // width) % COLUMN_SUM_FOLD == 0:
        flat = flat.reshape(COLUMN_SUM_FOLD, -1).sum(axis=0)
    return flat.reshape(-1, width).sum(axis=0)


def column_sums(a, b):
    """`column_sum` of `a` and of `b` (the same shape) as one reduction with two results,
    which reads a gradient they share once: layer norm's weight and bias gradients in
    the export for XLA on CUDA."""
    import jax
    import jax.numpy as jnp

    width = a.shape[-1]
    rows = (a.reshape(-1, width), b.reshape(-1, width))
    zeros = (jnp.float32(0), jnp.float32(0))
    return jax.lax.reduce(rows, zeros, lambda x, y: (x[0] + y[0], x[1] + y[1]), (0,))


def _statistics(x, eps: float = 1e-5):
    """Each row's mean and 1/σ over the last axis.

    XLA on CUDA takes the variance as E[x²] - E[x]²: the mean and the mean square in one
    pass over x, fused with the residual add that makes x, where the variance of the
    centred x needs a second pass (in float32, exact enough while |mean| ≪ 2¹² σ).
    """
    import jax.numpy as jnp

    mean = jnp.mean(x, axis=-1, keepdims=True)
    if xla_on_cuda():
        variance = jnp.maximum(jnp.mean(x * x, axis=-1, keepdims=True) - mean * mean, 0.0)
        return mean, 1.0 / jnp.sqrt(variance + eps)
    # Not `x - mean`: its gradient would be sum(-g), which IREE turns into a
    # subtracting reduction it cannot tile on GPU targets ("Failed to get an
    # identity value for the reduction operation"); the values are identical.
    centred = x + (-mean)
    variance = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return mean, 1.0 / jnp.sqrt(variance + eps)


def _normalized_gradient(x, mean, inverse_std, g_hat):
    """The gradient of x through x̂ = (x - mean) / σ, given x̂'s `g_hat`; and x̂.

    XLA on CUDA gets the forward's mean and 1/σ ([tokens] each) from behind an
    optimization barrier, so that it keeps them: else it recomputes them wherever x̂ is
    needed, and the weight's gradient, Σ g·x̂ over the rows, becomes a normalization
    fusion that writes g·x̂ ([tokens, width], float32) for a second fusion to sum.
    """
    import jax
    import jax.numpy as jnp

    if xla_on_cuda():
        mean, inverse_std = jax.lax.optimization_barrier((mean, inverse_std))
    x_hat = (x + (-mean)) * inverse_std
    mean_g = jnp.mean(g_hat, axis=-1, keepdims=True)
    mean_g_x = jnp.mean(g_hat * x_hat, axis=-1, keepdims=True)
    return inverse_std * (g_hat - mean_g - x_hat * mean_g_x), x_hat


@functools.cache
def layer_norm(out_dtype: str = "float32"):
    """Layer norm over the last axis, `x̂ * weight + bias`, with a hand-written gradient.

    The backward pass keeps the input x, which the residual stream holds anyway, and
    the per-row mean and 1/σ, and recomputes x̂ where it needs it. Autodiff kept the
    centred input and the normalised one as well: passes over the activations that
    the forward dispatch wrote and the backward one read back. With a bf16 `out_dtype`
    (where a bf16 product reads the output, as under torch.autocast) the output is
    rounded once and its gradient arrives in bf16; the arithmetic stays float32.
    """
    import jax
    import jax.numpy as jnp

    def forward(x, weight, bias):
        mean, inverse_std = _statistics(x)
        out = ((x + (-mean)) * inverse_std * weight + bias).astype(out_dtype)
        return out, (x, mean, inverse_std, weight)

    def backward(residuals, g):
        x, mean, inverse_std, weight = residuals
        g = g.astype(jnp.float32)
        grad_x, x_hat = _normalized_gradient(x, mean, inverse_std, g * weight)
        if xla_on_cuda():
            return grad_x, *column_sums(g * x_hat, g)
        return grad_x, column_sum(g * x_hat), column_sum(g)

    layer_norm = jax.custom_vjp(lambda x, weight, bias: forward(x, weight, bias)[0])
    layer_norm.defvjp(forward, backward)
    return layer_norm


@functools.cache
def normalized(out_dtype: str = "float32"):
    """x̂ = (x - mean) / σ over the last axis: `layer_norm` without its weight and bias,
    for a product that takes them into its own (see nanogpt's `_normed`).
    The same gradient, with no sums over the rows for a weight and a bias."""
    import jax
    import jax.numpy as jnp

    def forward(x):
        mean, inverse_std = _statistics(x)
        return ((x + (-mean)) * inverse_std).astype(out_dtype), (x, mean, inverse_std)

    def backward(residuals, g):
        return (_normalized_gradient(*residuals, g.astype(jnp.float32))[0],)

    normalized = jax.custom_vjp(lambda x: forward(x)[0])
    normalized.defvjp(forward, backward)
    return normalized


@functools.cache
def kept_gradient():
    """The identity, whose gradient passes an optimization barrier.

    On the residual stream (nanogpt's `_block`, for XLA on CUDA) the gradient is then
    written once in float32 where layer norm's backward pass makes it, and rounded to
    bf16 for the branch's products from there; without the barrier XLA computed layer
    norm's backward pass a second time to write the bf16 copy.
    """
    import jax

    kept = jax.custom_vjp(lambda x: x)
    kept.defvjp(lambda x: (x, None), lambda _, g: (jax.lax.optimization_barrier(g),))
    return kept


@functools.cache
def add_bias():
    """`x + bias` for [..., width] x and a [width] bias (see `column_sum`)."""
    import jax
    import jax.numpy as jnp

    def add(x, bias):
        return x + bias.astype(x.dtype)  # a bf16 product's output stays bf16

    add_bias = jax.custom_vjp(add)
    add_bias.defvjp(
        lambda x, bias: (add(x, bias), None),
        lambda _, g: (g, column_sum(g.astype(jnp.float32))),
    )
    return add_bias


@functools.cache
def add_positions():
    """`x + positions` for [batch, time, width] x and [time, width] positions, whose
    gradient sums over the batch as a chain of adds, one per sequence, not a reduction.

    XLA's layout assignment lays a reduction's operand out with the reduced axes minor
    wherever that makes it a row reduction it runs well (a batch of 32 or more on CUDA);
    for the positions' gradient that operand is the residual stream's gradient, and the
    layout spread to the whole float32 residual stream, forward and back, with a
    transpose wherever a product or cuDNN reads it. The adds are one elementwise pass
    over the same bytes. (For XLA on CUDA: the portable program adds as usual.)
    """
    import jax

    def backward(_, g):
        return g, functools.reduce(operator.add, (g[i] for i in range(g.shape[0])))

    add = jax.custom_vjp(lambda x, positions: x + positions)
    add.defvjp(lambda x, positions: (x + positions, None), backward)
    return add


@functools.cache
def rounded_dense(precision: str, in_dtype: str, out_dtype: str):
    """`x @ weight + bias` with the bias added in float32 and the sum rounded once to
    `out_dtype`; the gradient of `x` is the backward product's own output in `in_dtype`.

    So a bf16 activation between two products (qkv into cuDNN, cuDNN's output into
    `c_proj`) is written once in bf16, as the next product reads it, and its gradient
    likewise: rounding a float32 result to bf16 as a separate pass computes the same
    values and moves three times the bytes. In the export for XLA on CUDA a bf16 output
    under `bf16` is the product's own (accumulated in float32) plus the bias rounded to
    bf16, as torch.autocast computes it: the product writes half the bytes and the pass
    after it reads half, the sum rounded twice where it was rounded once.
    """
    import jax
    import jax.numpy as jnp

    def forward(x, weight, bias):
        x, weight = precisions.stored(x, precision), precisions.stored(weight, precision)
        if xla_on_cuda() and precision == "bf16" and out_dtype == "bfloat16":
            y = jnp.matmul(x, weight, preferred_element_type=jnp.bfloat16)
            return y + bias.astype(jnp.bfloat16), (x, weight)
        y = jnp.matmul(x, weight, preferred_element_type=jnp.float32) + bias
        return y.astype(out_dtype), (x, weight)

    def backward(residuals, g):
        x, weight = residuals
        g_in = precisions.stored(g, precision)
        grad_x = jnp.matmul(g_in, weight.T, preferred_element_type=jnp.float32).astype(in_dtype)
        grad_weight = precisions.weight_gradient(x, g_in, precision)
        return grad_x, grad_weight, column_sum(g.astype(jnp.float32))

    dense = jax.custom_vjp(lambda x, weight, bias: forward(x, weight, bias)[0])
    dense.defvjp(forward, backward)
    return dense


@functools.cache
def split_heads(heads: int):
    """[batch, time, 3 · width] → q, k, v, each [batch, heads, time, head width].

    One transpose to [3, batch, heads, time, head width], whose leading slices are
    contiguous. Split first, IREE copied each third out of the rows (a strided
    `slow_memcpy`, three a layer forward and three back) before transposing it. The
    gradient stacks the three and transposes back. Autodiff of the slices padded each
    gradient with zeros to the whole and added the three, so a pass read three such
    tensors, two thirds of them zeros.
    """
    import jax
    import jax.numpy as jnp

    def split(qkv):
        batch, time, width3 = qkv.shape
        stacked = qkv.reshape(batch, time, 3, heads, width3 // (3 * heads))
        stacked = stacked.transpose(2, 0, 3, 1, 4)
        return stacked[0], stacked[1], stacked[2]

    def backward(_, grads):
        batch, _, time, head_width = grads[0].shape
        stacked = jnp.stack(grads).transpose(1, 3, 0, 2, 4)
        return (stacked.reshape(batch, time, 3 * heads * head_width),)

    split_heads = jax.custom_vjp(split)
    split_heads.defvjp(lambda qkv: (split(qkv), None), backward)
    return split_heads


def one_hot_add(base, indices, value: float):
    """`base` with `value` added at [..., indices[...]]: one entry per row (the one-hots of
    the portable cross-entropy's and embedding's gradients).

    A scatter-add rather than a comparison with an iota, which fails SPIR-V lowering.
    The positions are distinct, and saying so (`unique_indices`) lets IREE spread the
    scatter over the GPU's threads; without it the whole scatter runs on one thread.
    """
    import jax.numpy as jnp

    index = jnp.indices(indices.shape, sparse=True)
    return base.at[(*index, indices)].add(value, unique_indices=True)
