"""The built-in model: a character-level GPT (after nanoGPT) in plain JAX.

Pre-norm transformer blocks, causal self-attention, GELU MLP, weights tied between
the token embedding and the output head. Every matrix product goes through
`pcp_core.program.precision.matmul`, so the run's precision (`f32` or `bf16`) applies to all.
"""

import functools
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from pcp_core.config import PRECISIONS
from pcp_core.models import Model, Params
from pcp_core.program import layers, losses
from pcp_core.program import precision as precisions
from pcp_core.program.build import export_platform
from pcp_core.program.mesh import devices_at_hand, on_each_device
from pcp_core.program.portable_attention import causal_attention

log = structlog.get_logger(__name__)

# Platforms whose exported program (XLA's) computes attention with cuDNN's fused kernel
# under `bf16` (flash attention: the [time, time] scores never reach memory); the
# portable form stays for IREE, for f32, and where jax finds no cuDNN while exporting.
FUSED_ATTENTION_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported `bf16` program, where cuDNN computes attention, passes q, k, v
# and the attention's output between the products and cuDNN in bf16: the values cuDNN
# took and gave anyway (each product adds its bias in float32 and rounds once), so the
# same numbers, without a float32 copy of each written and converted (see `_dense`).
BF16_ATTENTION_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported program takes the embedding's gradient by sorting the tokens
# and summing each token's rows (see `layers.sorted_embedding_gradient`) rather than as the
# one-hot product: a product as large as the output head's, for a few MB of sums.
SORTED_EMBEDDING_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported `bf16` program rounds to bf16, as torch.autocast does, the
# activations that only a bf16 product reads or that a product makes for the residual
# stream: layer norm's output, with the gradient that comes back to it
# (`BF16_NORM_OUTPUT_PLATFORMS`); each residual branch's output (`c_proj`, its bias added
# in bf16) before it is added to the float32 residual stream
# (`BF16_RESIDUAL_BRANCH_PLATFORMS`); and the logits, whose cross-entropy is still taken
# in float32 (`BF16_LOGITS_PLATFORMS`). Each halves the bytes of a [tokens, width] (or
# [tokens, vocabulary]) tensor written and read back, and changes the numbers by a
# rounding of 2⁻⁹ of each value; the loss curves stay within the anchor's own distance
# from PCP's. On an H100, GPT-2 small bf16, batch 16: 40.14 → 38.93 ms a step for the
# first two, 38.16 with the logits (benchmarks/results/gpu/h100/2026-11-26).
BF16_NORM_OUTPUT_PLATFORMS: tuple[str, ...] = ("cuda",)
BF16_RESIDUAL_BRANCH_PLATFORMS: tuple[str, ...] = ("cuda",)
BF16_LOGITS_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported program keeps the residual stream's gradient apart from layer
# norm's backward pass (see `layers.kept_gradient`): on an H200, with the roundings above
# and layer norm's statistics kept, 19.50 → 19.12 ms a step at batch 8, even at 16.
RESIDUAL_GRADIENT_KEPT_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported program folds each block's layer norm weight w and bias b into
# the product that reads the norm (see `_normed`): (x̂·w + b)·W + c = x̂·(w∘W) + (b·W + c),
# the same function of the same parameters. Layer norm's backward pass then sums nothing
# over the rows (a pass that read its [tokens, width] input and gradient again for two
# [width] sums); w's and b's gradients come from weight-sized sums over W's gradient.
NORM_FOLDED_PLATFORMS: tuple[str, ...] = ("cuda",)
# Platforms whose exported program sums the position embedding's gradient over the batch
# as a chain of adds (see `layers.add_positions`): as a reduction over the batch, XLA laid
# the whole float32 residual stream out batch-minor from batch 32 on, and transposed it
# wherever it was read. On an H200, GPT-2 small bf16, batch 32: 67.14 → 64.33 ms a step
# (torch.compile 63.27); at 8-24 no change beyond the spread between calls
# (benchmarks/results/gpu/h200/2026-11-29-b32-profile).
POSITION_ADDS_PLATFORMS: tuple[str, ...] = ("cuda",)

# `remat`: 0 keeps every activation for the backward pass; 1 (`--remat blocks`) keeps only
# each transformer block's input and recomputes the block's activations from it there.
DEFAULTS = {
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 64,
    "block_size": 64,
    "vocab_size": 256,
    "remat": 0,
}
REMAT_BLOCKS = 1

# Named sizes (`--model-size`); the vocabulary always comes from the data.
PRESETS = {
    "tiny": {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 64},  # the defaults
    "shakespeare-char": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256},
    "gpt2-small": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024},
    "gpt2-medium": {"n_layer": 24, "n_head": 16, "n_embd": 1024, "block_size": 1024},
    "gpt2-large": {"n_layer": 36, "n_head": 20, "n_embd": 1280, "block_size": 1024},
    "gpt2-xl": {"n_layer": 48, "n_head": 25, "n_embd": 1600, "block_size": 1024},
}


def validate(config: Mapping[str, int]) -> None:
    for key, value in config.items():
        if key == "remat":
            if value not in (0, REMAT_BLOCKS):
                raise ValueError(f"model setting remat must be 0 or {REMAT_BLOCKS}, got {value!r}")
        elif not isinstance(value, int) or value <= 0:
            raise ValueError(f"model setting {key} must be a positive integer, got {value!r}")
    if config["n_embd"] % config["n_head"]:
        raise ValueError(
            f"n_embd ({config['n_embd']}) must be divisible by n_head ({config['n_head']})"
        )


def shapes(config: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape, in the fixed order (the order the wire and checkpoints use)."""
    width = config["n_embd"]
    result: dict[str, tuple[int, ...]] = {
        "wte": (config["vocab_size"], width),
        "wpe": (config["block_size"], width),
    }
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


def _dense(params: Params, name: str, x, precision: str, out_dtype=None):
    """`x @ weight + bias` of the layer `name`; in `out_dtype` (bf16 where the program
    keeps that activation in bf16), else float32. A bf16 `x` gets a bf16 gradient."""
    import jax.numpy as jnp

    weight, bias = params[name + ".weight"], params[name + ".bias"]
    if out_dtype is None and (x.dtype == jnp.float32 or precisions.bf16_outputs(precision)):
        return layers.add_bias()(precisions.matmul(x, weight, precision), bias)
    out = jnp.dtype(out_dtype or jnp.float32).name
    return layers.rounded_dense(precision, jnp.dtype(x.dtype).name, out)(x, weight, bias)


def _normed(params: Params, norm: str, dense: str, x, out_dtype: str, fold: bool):
    """The layer norm `norm` of `x` in `out_dtype`, and the parameters that the layer
    `dense`, which reads it, takes: with `fold`, x̂ alone, and `dense`'s weight and bias
    with the norm's folded in (see `NORM_FOLDED_PLATFORMS`)."""
    import jax.numpy as jnp

    weight, bias = params[norm + ".weight"], params[norm + ".bias"]
    if not fold:
        return layers.layer_norm(out_dtype)(x, weight, bias), params
    matrix = params[dense + ".weight"]
    folded = {
        dense + ".weight": weight[:, None] * matrix,
        # a sum, not a product: float32 throughout, where XLA may take TF32 for a product
        dense + ".bias": params[dense + ".bias"] + jnp.sum(bias[:, None] * matrix, axis=0),
    }
    return layers.normalized(out_dtype)(x), params | folded


def _dense_gelu(params: Params, name: str, x, precision: str, out_dtype):
    """GELU of the layer `name`'s output, in `out_dtype` (the hidden activation's)."""
    import jax.numpy as jnp

    fused = (
        out_dtype == jnp.bfloat16
        and precision == "bf16"
        and export_platform() in layers.DENSE_GELU_PLATFORMS
        and export_platform() in layers.BF16_PRODUCT_OUTPUT_PLATFORMS
    )
    if fused:
        weight, bias = params[name + ".weight"], params[name + ".bias"]
        return layers.dense_gelu(precision, jnp.dtype(x.dtype).name)(x, weight, bias)
    return layers.gelu(precision)(_dense(params, name, x, precision, out_dtype))


def _attention(config: Mapping[str, int], params: Params, prefix: str, x, precision: str):
    import jax.numpy as jnp

    batch, time, width = x.shape
    heads = config["n_head"]
    fused_here = (
        precision == "bf16"
        and export_platform() in FUSED_ATTENTION_PLATFORMS
        and devices_at_hand()  # cuDNN's attention is lowered with its devices present
    )
    in_bf16 = fused_here and export_platform() in BF16_ATTENTION_PLATFORMS
    qkv = _dense(params, prefix + "c_attn", x, precision, jnp.bfloat16 if in_bf16 else None)
    branch = _bf16_where(precision, BF16_RESIDUAL_BRANCH_PLATFORMS)
    if fused_here:
        fused = _fused_attention(qkv, heads)
        if fused is not None:
            return _dense(params, prefix + "c_proj", fused, precision, branch)
    q, k, v = layers.split_heads(heads)(qkv)
    out = causal_attention(q, k, v, precision).transpose(0, 2, 1, 3).reshape(batch, time, width)
    return _dense(params, prefix + "c_proj", out, precision, branch)


def _bf16_where(precision: str, platforms: tuple[str, ...]):
    """bf16 where the program being traced is `bf16` and exported for one of `platforms`."""
    import jax.numpy as jnp

    return jnp.bfloat16 if precision == "bf16" and export_platform() in platforms else None


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
    attention = functools.partial(
        jax.nn.dot_product_attention, is_causal=True, implementation="cudnn"
    )
    try:  # on several devices, each one's part of the batch (XLA cannot split the call)
        out = on_each_device(attention)(q, k, v)
    except (RuntimeError, NotImplementedError) as error:
        _no_fused_attention(str(error))
        return None
    return out.astype(qkv.dtype).reshape(batch, time, width3 // 3)


@functools.cache
def _no_fused_attention(reason: str) -> None:
    log.warning("no cuDNN attention here; exporting the portable form", reason=reason)


def _block(config: Mapping[str, int], prefix: str, precision: str, params: Params, x):
    """The transformer block `prefix` ("h.3.") applied to the residual stream `x`; `params`
    needs only the block's own."""
    import jax.numpy as jnp

    hidden = jnp.bfloat16 if precisions.bf16_hidden(precision) else None
    in_bf16 = _bf16_where(precision, BF16_NORM_OUTPUT_PLATFORMS) is not None
    normed = functools.partial(
        _normed,
        params,
        out_dtype="bfloat16" if in_bf16 else "float32",
        fold=export_platform() in NORM_FOLDED_PLATFORMS,
    )
    branch = _bf16_where(precision, BF16_RESIDUAL_BRANCH_PLATFORMS)
    kept = export_platform() in RESIDUAL_GRADIENT_KEPT_PLATFORMS
    residual = layers.kept_gradient() if kept else (lambda x: x)
    h, block = normed(prefix + "ln_1", prefix + "attn.c_attn", x)
    x = residual(x + _attention(config, block, prefix + "attn.", h, precision))
    h, block = normed(prefix + "ln_2", prefix + "mlp.c_fc", x)
    h = _dense_gelu(block, prefix + "mlp.c_fc", h, precision, hidden)
    return residual(x + _dense(params, prefix + "mlp.c_proj", h, precision, branch))


def logits(config: Mapping[str, int], params: Params, tokens, precision: str = "f32"):
    import jax

    time = tokens.shape[1]
    by_comparison = export_platform() in layers.XLA_FORM_PLATFORMS
    sorted_rows = export_platform() in SORTED_EMBEDDING_PLATFORMS
    embed = layers.embedding(precision, by_comparison, sorted_rows)
    add = layers.add_positions() if export_platform() in POSITION_ADDS_PLATFORMS else operator.add
    x = add(embed(params["wte"], tokens), params["wpe"][:time])
    # With `remat`, each block under jax.checkpoint: its input is what the backward pass
    # keeps, and the block's forward pass runs again there. A platform's export fences the
    # recomputation with optimization barriers, so that XLA cannot merge it back into the
    # forward pass; the portable program has none: with them IREE 3.13 computed other
    # losses (the default model, batch 8) or its runtime failed the step (batch 16).
    rematerialised = config.get("remat", 0) == REMAT_BLOCKS
    for i in range(config["n_layer"]):
        p = f"h.{i}."
        block: Callable[..., Any] = functools.partial(_block, config, p, precision)
        if rematerialised:
            block = jax.checkpoint(block, prevent_cse=export_platform() is not None)
        x = block({k: v for k, v in params.items() if k.startswith(p)}, x)
    x = layers.layer_norm()(x, params["ln_f.weight"], params["ln_f.bias"])
    in_bf16 = _bf16_where(precision, BF16_LOGITS_PLATFORMS) is not None
    return precisions.matmul(x, params["wte"].T, precision, bf16_out=in_bf16)


def cache_shape(config: Mapping[str, int], batch: int) -> tuple[int, ...]:
    """The key/value cache `decode` keeps: [layer, key or value, batch, head, position,
    head width], a block of positions."""
    heads = config["n_head"]
    return (config["n_layer"], 2, batch, heads, config["block_size"], config["n_embd"] // heads)


def decode(config: Mapping[str, int], params: Params, cache, tokens, start, last):
    """Logits [batch, vocab] at row `last` of `tokens` [batch, time], the tokens at
    positions start, start + 1, ... of a sequence whose earlier keys and values `cache`
    holds; and the cache with theirs written in. As `logits` in f32 (the portable form),
    over a block of positions where the later ones are masked out, so that a token costs
    one position, not the whole context (`pcp sample --backend`)."""
    import jax
    import jax.numpy as jnp

    batch, time = tokens.shape
    heads, width = config["n_head"], config["n_embd"]
    x = jnp.take(params["wte"], tokens, axis=0)
    x = x + jax.lax.dynamic_slice_in_dim(params["wpe"], start, time)
    seen = jnp.arange(config["block_size"])[None, :] <= start + jnp.arange(time)[:, None]
    norm = layers.layer_norm()
    for i in range(config["n_layer"]):
        p = f"h.{i}."
        h = norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"])
        q, k, v = layers.split_heads(heads)(_dense(params, p + "attn.c_attn", h, "f32"))
        cache = jax.lax.dynamic_update_slice(cache, jnp.stack([k, v])[None], (i, 0, 0, 0, start, 0))
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, cache[i, 0]) * (1.0 / math.sqrt(width // heads))
        scores = jnp.where(seen, scores, jnp.finfo(scores.dtype).min)
        out = jnp.einsum("bhqk,bhkd->bqhd", jax.nn.softmax(scores, axis=-1), cache[i, 1])
        x = x + _dense(params, p + "attn.c_proj", out.reshape(batch, time, width), "f32")
        h = norm(x, params[p + "ln_2.weight"], params[p + "ln_2.bias"])
        h = layers.gelu("f32")(_dense(params, p + "mlp.c_fc", h, "f32"))
        x = x + _dense(params, p + "mlp.c_proj", h, "f32")
    x = jax.lax.dynamic_index_in_dim(x, last, axis=1, keepdims=False)
    x = layers.layer_norm()(x, params["ln_f.weight"], params["ln_f.bias"])
    return jnp.einsum("bd,vd->bv", x, params["wte"]), cache  # no transposed copy of wte


def loss(config: Mapping[str, int], params: Params, tokens, targets, precision: str = "f32"):
    """Mean cross-entropy of next-character prediction."""
    in_one_pass = export_platform() in layers.XLA_FORM_PLATFORMS
    mean_loss = losses.cross_entropy_in_one_pass() if in_one_pass else losses.cross_entropy()
    return mean_loss(logits(config, params, tokens, precision), targets)


MODEL = Model(
    name="nanogpt",
    defaults=DEFAULTS,
    init=init,
    loss=loss,
    validate=validate,
    precisions=PRECISIONS,
    description="character-level GPT (nanoGPT) in plain JAX",
    presets=PRESETS,
    shapes=shapes,
    logits=logits,
    decode=decode,
    cache_shape=cache_shape,
)
