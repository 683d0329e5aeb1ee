"""The built-in model's layers with hand-written gradients.

Each keeps fewer tensors for the backward pass than autodiff would, or computes its
gradient in a form the compilers run well (IREE on GPUs, or XLA on CUDA where the
platform lists below say so). `pcp_core.program.nanogpt` builds the model from them;
tests/test_nanogpt_gradients.py checks each against autodiff.
"""

import functools
import math
import operator

from pcp_core.program import precision as precisions
from pcp_core.program.build import export_platform

# Platforms whose exported program takes the forms XLA compiles well where IREE needed
# others: one-hot matrices made by comparing with an iota rather than by a scatter (see
# `embedding`), the cross-entropy's gradient recomputed from the logits in one pass
# (see `cross_entropy_in_one_pass`), and bias gradients as plain sums (see
# `column_sum`). The same numbers in other forms, and no atomics: a step on the GPU
# gives the same bits each time (the conformance suite checks it).
# benchmarks/torch_anchor.py empties these to time the portable program through XLA.
XLA_FORM_PLATFORMS: tuple[str, ...] = ("cuda",)


# Platforms whose exported `bf16` program makes an activation kept in bf16 (see
# `rounded_dense`: q, k, v for cuDNN, the MLP's hidden activation) as torch.autocast
# does: a product that outputs bf16 (accumulated in float32), plus the bias rounded to
# bf16. The product then writes half the bytes, and the pass after it (GELU, the split
# for cuDNN) reads half; the sum is rounded twice where it was rounded once.
BF16_PRODUCT_OUTPUT_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported program recomputes GELU's tanh (or σ, see
# `GELU_SIGMOID_PLATFORMS`) in the backward pass behind an optimization barrier (see
# `gelu`): XLA otherwise merges the recomputation with the forward's (the same ops on the
# same bf16 input) and keeps it from the forward pass to the backward in float32, twice
# the bytes of the input it would recompute from.
GELU_RECOMPUTED_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported program computes GELU's tanh approximation as x·σ(2u), with
# u = √(2/π)(x + 0.044715x³) (see `gelu_value`), since 0.5(1 + tanh(u)) = σ(2u): an exp
# and a division per element where XLA's tanh is a clamped rational polynomial and a
# division. The GELU passes are bound by that arithmetic, not by their bytes: on an H200
# at batch 16 the forward pass 83.7 → 71.1 us a layer (torch.compile's: 69.7), the
# backward 105.6 → 96.3; a step 34.92 → 34.85 ms in turns (the power cap takes back
# part of it), at batch 32 66.52 → 66.20.
GELU_SIGMOID_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported program gives layer norm's backward pass the forward's mean
# and 1/σ from behind an optimization barrier (see `layer_norm`), so that XLA keeps them
# ([tokens] each): else it recomputes them wherever x̂ is needed, and the weight's
# gradient, Σ g·x̂ over the rows, became a normalization fusion that wrote g·x̂
# ([tokens, width], float32) for a second fusion to sum. With the bf16 roundings of
# nanogpt's `BF16_*_PLATFORMS`, on an H200 at batch 16: 36.45 → 34.94 ms a step.
LAYER_NORM_STATISTICS_KEPT_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported program takes layer norm's variance as E[x²] - E[x]² (see
# `layer_norm`): the mean and the mean square in one pass over x, with the residual add
# that makes x, where the variance of the centred x needed a second pass (21 us a layer
# norm at batch 16 on an H100: 37.78 → 37.10 ms a step).
LAYER_NORM_ONE_PASS_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported `bf16` program computes the MLP's first product and GELU as
# `dense_gelu`, where its output is bf16 (nanogpt's hidden activation): on an H100 the
# GELU pass 101 → 86 us a layer at batch 16, with the one pass above 37.78 → 36.98 ms a
# step (torch.compile 36.36), at batch 8 20.94 → 20.33 (torch.compile 20.70).
DENSE_GELU_PLATFORMS: tuple[str, ...] = ("cuda",)


# Platforms whose exported program sums layer norm's weight and bias gradients in one
# reduction with two results (see `column_sums`), reading the gradient once: on an H100
# at batch 16, 36.61 → 36.35 ms a step (torch.compile 35.87), at batch 8 20.73 → 20.48.
LAYER_NORM_ONE_SUM_PLATFORMS: tuple[str, ...] = ("cuda",)


# Rows that each stage of `column_sum` adds together, and the most left for its last sum.
COLUMN_SUM_FOLD = 64


COLUMN_SUM_LAST = 128


def column_sum(g):
    """The sum of `g` over every axis but the last, as folds of the leading axis.

    This is the gradient of every broadcast bias and norm weight. Each stage views the
    rows as [fold, rows/fold · width] and adds along the leading axis, so every GPU
    thread owns outputs and a warp reads neighbouring elements. Summed along the rows
    (or in contiguous blocks of rows), IREE gave each output a warp of its own reading
    one column with a stride of the width: 26 us for 8192x384 on an H100, where the
    bytes need 4, and 2 ms of a bf16 GPT step. Folds of 64 rather than 16 take IREE
    the same time and XLA 0.2 ms less a step.
    """
    width = g.shape[-1]
    if export_platform() in XLA_FORM_PLATFORMS:  # XLA fuses a plain sum with its producer
        return g.reshape(-1, width).sum(axis=0)
    flat = g.reshape(-1)
    while flat.size // width > COLUMN_SUM_LAST and (flat.size // width) % COLUMN_SUM_FOLD == 0:
        flat = flat.reshape(COLUMN_SUM_FOLD, -1).sum(axis=0)
    return flat.reshape(-1, width).sum(axis=0)


def column_sums(a, b):
    """`column_sum` of `a` and of `b` (the same shape) as one reduction with two results."""
    import jax
    import jax.numpy as jnp

    width = a.shape[-1]
    rows = (a.reshape(-1, width), b.reshape(-1, width))
    zeros = (jnp.float32(0), jnp.float32(0))
    return jax.lax.reduce(rows, zeros, lambda x, y: (x[0] + y[0], x[1] + y[1]), (0,))


def _statistics(x, eps: float = 1e-5):
    """Each row's mean and 1/σ over the last axis."""
    import jax.numpy as jnp

    mean = jnp.mean(x, axis=-1, keepdims=True)
    if export_platform() in LAYER_NORM_ONE_PASS_PLATFORMS:  # (float32: |mean| ≪ 2¹² σ)
        variance = jnp.maximum(jnp.mean(x * x, axis=-1, keepdims=True) - mean * mean, 0.0)
        return mean, 1.0 / jnp.sqrt(variance + eps)
    # Not `x - mean`: its gradient would be sum(-g), which IREE turns into a
    # subtracting reduction it cannot tile on GPU targets ("Failed to get an
    # identity value for the reduction operation"); the values are identical.
    centred = x + (-mean)
    variance = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return mean, 1.0 / jnp.sqrt(variance + eps)


def _normalized_gradient(x, mean, inverse_std, g_hat):
    """The gradient of x through x̂ = (x - mean) / σ, given x̂'s `g_hat`; and x̂."""
    import jax
    import jax.numpy as jnp

    if export_platform() in LAYER_NORM_STATISTICS_KEPT_PLATFORMS:
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
        if export_platform() in LAYER_NORM_ONE_SUM_PLATFORMS:
            return grad_x, *column_sums(g * x_hat, g)
        return grad_x, column_sum(g * x_hat), column_sum(g)

    layer_norm = jax.custom_vjp(lambda x, weight, bias: forward(x, weight, bias)[0])
    layer_norm.defvjp(forward, backward)
    return layer_norm


@functools.cache
def normalized(out_dtype: str = "float32"):
    """x̂ = (x - mean) / σ over the last axis: `layer_norm` without its weight and bias,
    for a product that takes them into its own (see nanogpt's `NORM_FOLDED_PLATFORMS`).
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

    On the residual stream (see nanogpt's `RESIDUAL_GRADIENT_KEPT_PLATFORMS`) the
    gradient is written once in float32 where layer norm's backward pass makes it, and
    rounded to bf16 for the branch's products from there; without the barrier XLA
    computed layer norm's backward pass a second time to write the bf16 copy.
    """
    import jax

    kept = jax.custom_vjp(lambda x: x)
    kept.defvjp(lambda x: (x, None), lambda _, g: (jax.lax.optimization_barrier(g),))
    return kept


GELU_C = math.sqrt(2 / math.pi)  # GELU's tanh approximation (GPT-2's, jax.nn.gelu's)


@functools.cache
def gelu(precision: str):
    """GELU (tanh approximation) that keeps only its input for the backward pass.

    Autodiff of `jax.nn.gelu` kept x², tanh(·) and 0.5·(1 + tanh(·)) as well: IREE's MLP
    product wrote four float32 [tokens, 4·width] tensors and the backward pass read them
    back. The derivative is recomputed from x instead, elementwise in the pass that
    uses it; x is kept in the precision policy's dtype (bf16 under `bf16`, as the
    product that made it would store it).
    """
    import jax

    def backward(x, g):
        if export_platform() in GELU_RECOMPUTED_PLATFORMS:
            x = jax.lax.optimization_barrier(x)  # not the forward's tanh or σ, kept in float32
        return ((g * gelu_slope(x)).astype(g.dtype),)

    gelu = jax.custom_vjp(gelu_value)
    gelu.defvjp(lambda x: (gelu_value(x), precisions.stored(x, precision)), backward)
    return gelu


def gelu_value(x):
    """GELU of `x` computed in float32, in `x`'s dtype."""
    import jax.numpy as jnp

    y = x.astype(jnp.float32)  # (a bf16 product's output is computed in float32)
    u = GELU_C * (y + 0.044715 * (y * y * y))
    if export_platform() in GELU_SIGMOID_PLATFORMS:
        return (y / (1.0 + jnp.exp(-2.0 * u))).astype(x.dtype)
    return (0.5 * y * (1.0 + jnp.tanh(u))).astype(x.dtype)


def gelu_slope(x):
    """GELU's derivative at `x`, in float32."""
    import jax.numpy as jnp

    x = x.astype(jnp.float32)
    u = GELU_C * (x + 0.044715 * (x * x * x))
    du = GELU_C * (1.0 + 3 * 0.044715 * x * x)
    if export_platform() in GELU_SIGMOID_PLATFORMS:
        s = 1.0 / (1.0 + jnp.exp(-2.0 * u))  # σ(2u) = 0.5(1 + tanh(u))
        return s + 2.0 * x * s * (1.0 - s) * du
    t = jnp.tanh(u)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du


@functools.cache
def dense_gelu(precision: str, in_dtype: str):
    """`gelu(x @ weight + bias)` in bf16, as `rounded_dense` (bf16 product output, bias
    added in bf16) then `gelu` compute it, keeping the product's output for the backward
    pass rather than the sum with the bias.

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
    transpose wherever a product or cuDNN reads it (6.6 ms of a 67 ms step at batch 32
    on an H200). The adds are one elementwise pass over the same bytes.
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
    values and moves three times the bytes.
    """
    import jax
    import jax.numpy as jnp

    def forward(x, weight, bias):
        x, weight = precisions.stored(x, precision), precisions.stored(weight, precision)
        in_product = export_platform() in BF16_PRODUCT_OUTPUT_PLATFORMS
        if in_product and precision == "bf16" and out_dtype == "bfloat16":
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
    `slow_memcpy` of 32 us on an H100, three a layer forward and three back) before
    transposing it: the gpt-b32 bf16 step took 17.8 ms that way, 16.6 ms this way.
    The gradient stacks the three and transposes back. Autodiff of the slices padded
    each gradient with zeros to the whole and added the three, so a pass read three
    such tensors, two thirds of them zeros: written out, the H100 bf16 step takes 0.25
    ms less with IREE and 0.19 ms less with XLA.
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
    """`base` with `value` added at [..., indices[...]]: one entry per row.

    A scatter-add rather than a comparison with an iota, which fails SPIR-V lowering.
    The positions are distinct, and saying so (`unique_indices`) lets IREE spread the
    scatter over the GPU's threads; without it the whole scatter runs on one thread.
    """
    import jax.numpy as jnp

    index = jnp.indices(indices.shape, sparse=True)
    return base.at[(*index, indices)].add(value, unique_indices=True)


@functools.cache
def embedding(precision: str, by_comparison: bool = False, sorted_rows: bool = False):
    """`wte[tokens]`, whose gradient is the product one_hot(tokens)ᵀ · g.

    Autodiff of the gather gives a scatter-add of every position's row into the few
    rows of `wte`: with repeated tokens IREE serialises it on GPU targets, where it was
    28% of a GPT step. As a product it runs on the matrix units like any other; its
    cost is that of one output-head product, and the one-hot matrix is the size of the
    logits the output head already makes. XLA runs the scatter-add fast, but with
    atomics, so two runs would differ in the last bits; the product keeps a step
    reproducible. `by_comparison` (XLA's form) makes the one-hot by comparing with an
    iota, in one pass that writes it in the product's input dtype. `sorted_rows` takes
    the gradient by `sorted_embedding_gradient` instead.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    def forward(wte, tokens):
        return wte[tokens], (tokens, wte.shape[0])

    def backward(residuals, g):
        tokens, vocab = residuals
        rows = tokens.reshape(-1)
        if sorted_rows:
            grad = sorted_embedding_gradient(rows, g.reshape(rows.size, -1), vocab)
            return grad, np.zeros(tokens.shape, jax.dtypes.float0)
        if by_comparison:
            vocab_index = jax.lax.broadcasted_iota(jnp.int32, (rows.size, vocab), 1)
            one_hot = (vocab_index == rows[:, None]).astype(jnp.float32)
        else:
            one_hot = one_hot_add(jnp.zeros((rows.size, vocab), jnp.float32), rows, 1.0)
        grad = precisions.weight_gradient(one_hot, g.reshape(rows.size, -1), precision)
        return grad, np.zeros(tokens.shape, jax.dtypes.float0)

    embed = jax.custom_vjp(lambda wte, tokens: forward(wte, tokens)[0])
    embed.defvjp(forward, backward)
    return embed


def sorted_embedding_gradient(rows, g, vocab: int):
    """Σ g[i] over the rows i of each token, [vocab, width], with no atomics.

    Stably sorted by token, each token's rows lie together; an inclusive scan that
    restarts at each run's first row leaves the run's sum in its last row, and those
    rows go to their token's row of the result (one write each; the rest fall outside
    and are dropped). A scatter-add of every row computes the same with atomics, whose
    order (and last bits) change from run to run; the one-hot product does it as a
    [vocab, rows] x [rows, width] product. The sums are float32 throughout.
    """
    import jax
    import jax.numpy as jnp

    order = jnp.argsort(rows, stable=True)
    tokens, values = rows[order], g[order].astype(jnp.float32)
    starts = jnp.concatenate([jnp.ones((1,), bool), tokens[1:] != tokens[:-1]])

    def add_within_runs(a, b):
        (a_start, a_sum), (b_start, b_sum) = a, b
        return a_start | b_start, jnp.where(b_start[:, None], b_sum, a_sum + b_sum)

    _, sums = jax.lax.associative_scan(add_within_runs, (starts, values))
    last = jnp.concatenate([starts[1:], jnp.ones((1,), bool)])
    index = jnp.where(last, tokens, vocab)
    return jnp.zeros((vocab, g.shape[-1]), jnp.float32).at[index].set(sums, mode="drop")
