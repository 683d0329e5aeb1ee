"""The built-in model: a character-level GPT (after nanoGPT) in plain JAX.

Pre-norm transformer blocks, causal self-attention, GELU MLP, weights tied between
the token embedding and the output head. Every matrix product goes through
`pcp_core.program.precision.matmul`, so the run's precision (`f32` or `bf16`) applies to all.
"""

import functools
import math
from collections.abc import Mapping

import structlog

from pcp_core.models import Model, Params
from pcp_core.program import precision as precisions
from pcp_core.program.build import export_platform

log = structlog.get_logger(__name__)

# Platforms whose exported program (XLA's) computes attention with cuDNN's fused kernel
# under `bf16` (flash attention: the [time, time] scores never reach memory); the
# portable form stays for IREE, for f32, and where jax finds no cuDNN while exporting.
FUSED_ATTENTION_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported program takes the forms XLA compiles well where IREE needed
# others: one-hot matrices made by comparing with an iota rather than by a scatter (see
# `_embedding`), the cross-entropy's gradient recomputed from the logits in one pass
# (see `_cross_entropy_in_one_pass`), and bias gradients as plain sums (see
# `_column_sum`). The same numbers in other forms, and no atomics: a step on the GPU
# gives the same bits each time (the conformance suite checks it).
# benchmarks/torch_anchor.py empties these to time the portable program through XLA.
XLA_FORM_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported `bf16` program, where cuDNN computes attention, passes q, k, v
# and the attention's output between the products and cuDNN in bf16: the values cuDNN
# took and gave anyway (each product adds its bias in float32 and rounds once), so the
# same numbers, without a float32 copy of each written and converted (see `_dense`).
BF16_ATTENTION_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported program takes the embedding's gradient by sorting the tokens
# and summing each token's rows (see `_sorted_embedding_gradient`) rather than as the
# one-hot product: a product as large as the output head's, for a few MB of sums.
SORTED_EMBEDDING_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported program takes the cross-entropy's log-sum-exp in one pass
# over the logits (a running maximum and sum, see `_logsumexp_in_one_pass`), not two.
ONE_PASS_LOGSUMEXP_PLATFORMS: tuple[str, ...] = ("cuda",)

DEFAULTS = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 64, "vocab_size": 256}

# Named sizes (`--model-size`); the vocabulary always comes from the data.
PRESETS = {
    "tiny": {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 64},  # the defaults
    "shakespeare-char": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256},
    "gpt2-small": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024},
    "gpt2-medium": {"n_layer": 24, "n_head": 16, "n_embd": 1024, "block_size": 1024},
}


def validate(config: Mapping[str, int]) -> None:
    for key, value in config.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"model setting {key} must be a positive integer, got {value!r}")
    if config["n_embd"] % config["n_head"]:
        raise ValueError(
            f"n_embd ({config['n_embd']}) must be divisible by n_head ({config['n_head']})"
        )


def shapes(config: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape, in the fixed order (the order the wire and checkpoints use)."""
    width = config["n_embd"]
    result = {"wte": (config["vocab_size"], width), "wpe": (config["block_size"], width)}
    for i in range(config["n_layer"]):
        p = f"h.{i}."
        result |= _weight_and_bias(p + "ln_1", (width,), width)
        result |= _weight_and_bias(p + "attn.c_attn", (width, 3 * width), 3 * width)
        result |= _weight_and_bias(p + "attn.c_proj", (width, width), width)
        result |= _weight_and_bias(p + "ln_2", (width,), width)
        result |= _weight_and_bias(p + "mlp.c_fc", (width, 4 * width), 4 * width)
        result |= _weight_and_bias(p + "mlp.c_proj", (4 * width, width), width)
    return result | _weight_and_bias("ln_f", (width,), width)


def _weight_and_bias(name: str, weight: tuple[int, ...], bias: int) -> dict[str, tuple[int, ...]]:
    return {name + ".weight": weight, name + ".bias": (bias,)}


def init(config: Mapping[str, int], seed: int) -> Params:
    """Parameters in `shapes` order: normal(0.02) matrices (the residual projections
    scaled down by sqrt(2 * layers), as GPT-2), zero biases, unit norm weights."""
    import numpy as np

    rng = np.random.default_rng(seed)
    std, proj_std = 0.02, 0.02 / math.sqrt(2 * config["n_layer"])
    params: Params = {}
    for name, shape in shapes(config).items():
        if name.endswith(".bias"):
            params[name] = np.zeros(shape, np.float32)
        elif len(shape) == 1:  # a norm's weight
            params[name] = np.ones(shape, np.float32)
        else:
            scale = proj_std if name.endswith("c_proj.weight") else std
            params[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return params


# Rows that each stage of `_column_sum` adds together, and the most left for its last sum.
COLUMN_SUM_FOLD = 64
COLUMN_SUM_LAST = 128


def _column_sum(g):
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


@functools.cache
def _layer_norm():
    """Layer norm over the last axis, `x̂ * weight + bias`, with a hand-written gradient.

    The backward pass keeps the input x, which the residual stream holds anyway, and
    the per-row mean and 1/σ, and recomputes x̂ where it needs it. Autodiff kept the
    centred input and the normalised one as well: passes over the activations that
    the forward dispatch wrote and the backward one read back.
    """
    import jax
    import jax.numpy as jnp

    def statistics(x, eps: float = 1e-5):
        mean = jnp.mean(x, axis=-1, keepdims=True)
        # Not `x - mean`: its gradient would be sum(-g), which IREE turns into a
        # subtracting reduction it cannot tile on GPU targets ("Failed to get an
        # identity value for the reduction operation"); the values are identical.
        centred = x + (-mean)
        variance = jnp.mean(centred * centred, axis=-1, keepdims=True)
        return mean, 1.0 / jnp.sqrt(variance + eps)

    def forward(x, weight, bias):
        mean, inverse_std = statistics(x)
        return (x + (-mean)) * inverse_std * weight + bias, (x, mean, inverse_std, weight)

    def backward(residuals, g):
        x, mean, inverse_std, weight = residuals
        x_hat = (x + (-mean)) * inverse_std
        g_hat = g * weight
        mean_g = jnp.mean(g_hat, axis=-1, keepdims=True)
        mean_g_x = jnp.mean(g_hat * x_hat, axis=-1, keepdims=True)
        grad_x = inverse_std * (g_hat - mean_g - x_hat * mean_g_x)
        return grad_x, _column_sum(g * x_hat), _column_sum(g)

    layer_norm = jax.custom_vjp(lambda x, weight, bias: forward(x, weight, bias)[0])
    layer_norm.defvjp(forward, backward)
    return layer_norm


GELU_C = math.sqrt(2 / math.pi)  # GELU's tanh approximation (GPT-2's, jax.nn.gelu's)


@functools.cache
def _gelu(precision: str):
    """GELU (tanh approximation) that keeps only its input for the backward pass.

    Autodiff of `jax.nn.gelu` kept x², tanh(·) and 0.5·(1 + tanh(·)) as well: IREE's MLP
    product wrote four float32 [tokens, 4·width] tensors and the backward pass read them
    back. The derivative is recomputed from x instead, elementwise in the pass that
    uses it; x is kept in the precision policy's dtype (bf16 under `bf16`, as the
    product that made it would store it).
    """
    import jax
    import jax.numpy as jnp

    def value(x):
        y = x.astype(jnp.float32)  # (a bf16 product's output is computed in float32)
        return (0.5 * y * (1.0 + jnp.tanh(GELU_C * (y + 0.044715 * (y * y * y))))).astype(x.dtype)

    def backward(x, g):
        x = x.astype(jnp.float32)
        t = jnp.tanh(GELU_C * (x + 0.044715 * (x * x * x)))
        slope = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * x * x)
        return ((g * slope).astype(g.dtype),)

    gelu = jax.custom_vjp(value)
    gelu.defvjp(lambda x: (value(x), precisions.stored(x, precision)), backward)
    return gelu


@functools.cache
def _add_bias():
    """`x + bias` for [..., width] x and a [width] bias (see `_column_sum`)."""
    import jax
    import jax.numpy as jnp

    def add(x, bias):
        return x + bias.astype(x.dtype)  # a bf16 product's output stays bf16

    add_bias = jax.custom_vjp(add)
    add_bias.defvjp(
        lambda x, bias: (add(x, bias), None),
        lambda _, g: (g, _column_sum(g.astype(jnp.float32))),
    )
    return add_bias


def _dense(params: Params, name: str, x, precision: str, out_dtype=None):
    """`x @ weight + bias` of the layer `name`; in `out_dtype` (bf16 where the program
    keeps that activation in bf16), else float32. A bf16 `x` gets a bf16 gradient."""
    import jax.numpy as jnp

    weight, bias = params[name + ".weight"], params[name + ".bias"]
    if out_dtype is None and (x.dtype == jnp.float32 or precisions.bf16_outputs(precision)):
        return _add_bias()(precisions.matmul(x, weight, precision), bias)
    out = jnp.dtype(out_dtype or jnp.float32).name
    return _rounded_dense(precision, jnp.dtype(x.dtype).name, out)(x, weight, bias)


@functools.cache
def _rounded_dense(precision: str, in_dtype: str, out_dtype: str):
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
        y = jnp.matmul(x, weight, preferred_element_type=jnp.float32) + bias
        return y.astype(out_dtype), (x, weight)

    def backward(residuals, g):
        x, weight = residuals
        g_in = precisions.stored(g, precision)
        grad_x = jnp.matmul(g_in, weight.T, preferred_element_type=jnp.float32).astype(in_dtype)
        grad_weight = precisions.weight_gradient(x, g_in, precision)
        return grad_x, grad_weight, _column_sum(g.astype(jnp.float32))

    dense = jax.custom_vjp(lambda x, weight, bias: forward(x, weight, bias)[0])
    dense.defvjp(forward, backward)
    return dense


@functools.cache
def _split_heads(heads: int):
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


def _attention(config: Mapping[str, int], params: Params, prefix: str, x, precision: str):
    import jax
    import jax.numpy as jnp

    def matmul(a, b):
        return precisions.matmul(a, b, precision)

    batch, time, width = x.shape
    heads = config["n_head"]
    fused_here = precision == "bf16" and export_platform() in FUSED_ATTENTION_PLATFORMS
    in_bf16 = fused_here and export_platform() in BF16_ATTENTION_PLATFORMS
    qkv = _dense(params, prefix + "c_attn", x, precision, jnp.bfloat16 if in_bf16 else None)
    if fused_here:
        fused = _fused_attention(qkv, heads)
        if fused is not None:
            return _dense(params, prefix + "c_proj", fused, precision)
    q, k, v = _split_heads(heads)(qkv)
    scores = matmul(q, k.transpose(0, 1, 3, 2)).astype(jnp.float32)
    scores = scores * (1.0 / math.sqrt(width // heads))
    causal = jnp.tril(jnp.ones((time, time), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    out = matmul(jax.nn.softmax(scores, axis=-1), v)
    out = out.transpose(0, 2, 1, 3).reshape(batch, time, width)
    return _dense(params, prefix + "c_proj", out, precision)


def _fused_attention(qkv, heads: int):
    """Causal softmax(q·kᵀ/√d)·v of [batch, time, 3 · width] `qkv` by cuDNN (bf16 inputs,
    out in `qkv`'s dtype), or None where jax finds no cuDNN to trace it for.

    cuDNN takes [batch, time, heads, head width] as it is, so q, k and v are views of
    `qkv` with no transpose, and the output is the rows `c_proj` reads.
    """
    import jax
    import jax.numpy as jnp

    batch, time, width3 = qkv.shape
    stacked = qkv.astype(jnp.bfloat16).reshape(batch, time, 3, heads, width3 // (3 * heads))
    q, k, v = stacked[:, :, 0], stacked[:, :, 1], stacked[:, :, 2]
    try:
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    except (RuntimeError, NotImplementedError) as error:
        _no_fused_attention(str(error))
        return None
    return out.astype(qkv.dtype).reshape(batch, time, width3 // 3)


@functools.cache
def _no_fused_attention(reason: str) -> None:
    log.warning("no cuDNN attention here; exporting the portable form", reason=reason)


def _one_hot_add(base, indices, value: float):
    """`base` with `value` added at [..., indices[...]]: one entry per row.

    A scatter-add rather than a comparison with an iota, which fails SPIR-V lowering.
    The positions are distinct, and saying so (`unique_indices`) lets IREE spread the
    scatter over the GPU's threads; without it the whole scatter runs on one thread.
    """
    import jax.numpy as jnp

    index = jnp.indices(indices.shape, sparse=True)
    return base.at[(*index, indices)].add(value, unique_indices=True)


@functools.cache
def _embedding(precision: str, by_comparison: bool = False, sorted_rows: bool = False):
    """`wte[tokens]`, whose gradient is the product one_hot(tokens)ᵀ · g.

    Autodiff of the gather gives a scatter-add of every position's row into the few
    rows of `wte`: with repeated tokens IREE serialises it on GPU targets, where it was
    28% of a GPT step. As a product it runs on the matrix units like any other; its
    cost is that of one output-head product, and the one-hot matrix is the size of the
    logits the output head already makes. XLA runs the scatter-add fast, but with
    atomics, so two runs would differ in the last bits; the product keeps a step
    reproducible. `by_comparison` (XLA's form) makes the one-hot by comparing with an
    iota, in one pass that writes it in the product's input dtype. `sorted_rows` takes
    the gradient by `_sorted_embedding_gradient` instead.
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
            grad = _sorted_embedding_gradient(rows, g.reshape(rows.size, -1), vocab)
            return grad, np.zeros(tokens.shape, jax.dtypes.float0)
        if by_comparison:
            vocab_index = jax.lax.broadcasted_iota(jnp.int32, (rows.size, vocab), 1)
            one_hot = (vocab_index == rows[:, None]).astype(jnp.float32)
        else:
            one_hot = _one_hot_add(jnp.zeros((rows.size, vocab), jnp.float32), rows, 1.0)
        grad = precisions.weight_gradient(one_hot, g.reshape(rows.size, -1), precision)
        return grad, np.zeros(tokens.shape, jax.dtypes.float0)

    embed = jax.custom_vjp(lambda wte, tokens: forward(wte, tokens)[0])
    embed.defvjp(forward, backward)
    return embed


def _sorted_embedding_gradient(rows, g, vocab: int):
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


def logits(config: Mapping[str, int], params: Params, tokens, precision: str = "f32"):
    import jax.numpy as jnp

    time = tokens.shape[1]
    by_comparison = export_platform() in XLA_FORM_PLATFORMS
    sorted_rows = export_platform() in SORTED_EMBEDDING_PLATFORMS
    embed = _embedding(precision, by_comparison, sorted_rows)
    x = embed(params["wte"], tokens) + params["wpe"][:time]
    hidden = jnp.bfloat16 if precisions.bf16_hidden(precision) else None
    for i in range(config["n_layer"]):
        p = f"h.{i}."
        h = _layer_norm()(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"])
        x = x + _attention(config, params, p + "attn.", h, precision)
        h = _layer_norm()(x, params[p + "ln_2.weight"], params[p + "ln_2.bias"])
        h = _gelu(precision)(_dense(params, p + "mlp.c_fc", h, precision, hidden))
        x = x + _dense(params, p + "mlp.c_proj", h, precision)
    x = _layer_norm()(x, params["ln_f.weight"], params["ln_f.bias"])
    return precisions.matmul(x, params["wte"].T, precision)


@functools.cache
def _cross_entropy():
    """Mean cross-entropy of logits [..., vocab] against integer targets [...].

    With a hand-written gradient, (softmax - one_hot) * g / N: autodiff of log_softmax
    sums a negated cotangent, which IREE cannot compile for GPU targets (see
    `_layer_norm`); the one-hot part is a scatter-add of -1 (see `_one_hot_add`).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    def forward(logits, targets):
        shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
        log_total = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))
        picked = jnp.take_along_axis(shifted, targets[..., None], axis=-1)
        return jnp.mean(log_total - picked), (shifted, log_total, targets)

    def backward(residuals, g):
        shifted, log_total, targets = residuals
        grad = _one_hot_add(jnp.exp(shifted - log_total), targets, -1.0)
        return grad * (g / targets.size), np.zeros(targets.shape, jax.dtypes.float0)

    cross_entropy = jax.custom_vjp(lambda logits, targets: forward(logits, targets)[0])
    cross_entropy.defvjp(forward, backward)
    return cross_entropy


@functools.cache
def _cross_entropy_in_one_pass():
    """`_cross_entropy` as XLA computes it best: the backward pass recomputes the
    softmax from the logits (kept anyway: a product wrote them) and the log of its sum,
    and marks the targets by comparing with an iota, so exp, the one-hot and the
    scaling are one elementwise pass that writes the gradient in the logits' dtype.
    The scatter of `_cross_entropy` split that pass in three around it, and its kept
    `shifted` logits were one more logits-sized tensor written and read back.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    def forward(logits, targets):
        x = logits.astype(jnp.float32)
        if export_platform() in ONE_PASS_LOGSUMEXP_PLATFORMS:
            log_total = _logsumexp_in_one_pass(x)
        else:
            top = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
            log_total = top + jnp.log(jnp.sum(jnp.exp(x - top), axis=-1, keepdims=True))
        picked = jnp.take_along_axis(x, targets[..., None], axis=-1)
        return jnp.mean(log_total - picked), (logits, log_total, targets)

    def backward(residuals, g):
        logits, log_total, targets = residuals
        probabilities = jnp.exp(logits.astype(jnp.float32) - log_total)
        vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
        grad = jnp.where(vocab == targets[..., None], probabilities - 1.0, probabilities)
        grad = (grad * (g / targets.size)).astype(logits.dtype)
        return grad, np.zeros(targets.shape, jax.dtypes.float0)

    cross_entropy = jax.custom_vjp(lambda logits, targets: forward(logits, targets)[0])
    cross_entropy.defvjp(forward, backward)
    return cross_entropy


def _logsumexp_in_one_pass(x):
    """log Σ exp(x) over the last axis, [..., 1], reading `x` once.

    One reduction carries a running maximum and the sum of exp(x - maximum), rescaling
    the sum when the maximum grows (as flash attention does): the maximum and the sum as
    two reductions read the logits, the largest tensor of the step, twice. The start is
    float32's lowest, not -inf, so that two starts combine to a sum of 0, not NaN.
    """
    import jax
    import jax.numpy as jnp

    def combine(a, b):
        (a_top, a_sum), (b_top, b_sum) = a, b
        top = jnp.maximum(a_top, b_top)
        return top, a_sum * jnp.exp(a_top - top) + b_sum * jnp.exp(b_top - top)

    start = (jnp.float32(jnp.finfo(jnp.float32).min), jnp.float32(0))
    top, total = jax.lax.reduce((x, jnp.ones_like(x)), start, combine, (x.ndim - 1,))
    return (top + jnp.log(total))[..., None]


def loss(config: Mapping[str, int], params: Params, tokens, targets, precision: str = "f32"):
    """Mean cross-entropy of next-character prediction."""
    in_one_pass = export_platform() in XLA_FORM_PLATFORMS
    cross_entropy = _cross_entropy_in_one_pass() if in_one_pass else _cross_entropy()
    return cross_entropy(logits(config, params, tokens, precision), targets)


MODEL = Model(
    name="nanogpt",
    defaults=DEFAULTS,
    init=init,
    loss=loss,
    validate=validate,
    precisions=precisions.PRECISIONS,
    description="character-level GPT (nanoGPT) in plain JAX",
    presets=PRESETS,
    shapes=shapes,
    logits=logits,
)
