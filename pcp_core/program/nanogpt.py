"""The built-in model: a character-level GPT (after nanoGPT) in plain JAX.

Pre-norm transformer blocks, causal self-attention, GELU MLP, weights tied between
the token embedding and the output head. Every matrix product goes through
`pcp_core.program.precision.matmul`, so the run's precision (`f32` or `bf16`) applies to all.

The step exported for XLA on CUDA (`platform_export.xla_on_cuda`) takes the forms XLA
compiles well there: cuDNN's attention (`_attention`), bf16 activations where
torch.autocast keeps them (`_rounded_as_autocast`), layer norm folded into the product
after it (`_normed`), and the layers' and loss's own forms for it; docs/gpu.md measures them.
"""

import functools
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from pcp_core.config import PRECISIONS
from pcp_core.models import Model, Params
from pcp_core.program import embedding, gelu, layers, losses
from pcp_core.program import precision as precisions
from pcp_core.program.mesh import devices_at_hand, on_each_device
from pcp_core.program.platform_export import export_platform, xla_on_cuda
from pcp_core.program.portable_attention import causal_attention

log = structlog.get_logger(__name__)

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
    if out_dtype is None and x.dtype == jnp.float32:
        return layers.add_bias()(precisions.matmul(x, weight, precision), bias)
    out = jnp.dtype(out_dtype or jnp.float32).name
    return layers.rounded_dense(precision, jnp.dtype(x.dtype).name, out)(x, weight, bias)


def _normed(params: Params, norm: str, dense: str, x, out_dtype: str, fold: bool):
    """The layer norm `norm` of `x` in `out_dtype`, and the parameters that the layer
    `dense`, which reads it, takes: with `fold`, x̂ alone, and `dense`'s weight and bias
    with the norm's folded in, (x̂·w + b)·W + c = x̂·(w∘W) + (b·W + c): the same function
    of the same parameters. Layer norm's backward pass then sums nothing over the rows
    (a pass that read its [tokens, width] input and gradient again for two [width]
    sums); w's and b's gradients come from weight-sized sums over W's gradient."""
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


def _dense_gelu(params: Params, name: str, x, precision: str):
    """GELU of the layer `name`'s output: the MLP's hidden activation, in bf16 where
    `precision.bf16_hidden` says, computed by `gelu.dense_gelu` (one pass after the
    product), else in float32."""
    import jax.numpy as jnp

    if precisions.bf16_hidden(precision):
        weight, bias = params[name + ".weight"], params[name + ".bias"]
        return gelu.dense_gelu(precision, jnp.dtype(x.dtype).name)(x, weight, bias)
    return gelu.gelu(precision)(_dense(params, name, x, precision))


def _attention(config: Mapping[str, int], params: Params, prefix: str, x, precision: str):
    import jax.numpy as jnp

    batch, time, width = x.shape
    heads = config["n_head"]
    # cuDNN's fused (flash) attention under `bf16` in the export for XLA on CUDA, its
    # [time, time] scores never in memory; q, k, v and its output pass between it and the
    # products in bf16, the values cuDNN takes and gives anyway (each product adds its
    # bias in float32 and rounds once), with no float32 copy of each written and
    # converted. The portable form stays for IREE, for f32, and where jax finds no cuDNN.
    fused_here = (
        precision == "bf16"
        and xla_on_cuda()
        and devices_at_hand()  # cuDNN's attention is lowered with its devices present
    )
    qkv = _dense(params, prefix + "c_attn", x, precision, jnp.bfloat16 if fused_here else None)
    branch = _rounded_as_autocast(precision)
    if fused_here:
        fused = _fused_attention(qkv, heads)
        if fused is not None:
            return _dense(params, prefix + "c_proj", fused, precision, branch)
    q, k, v = layers.split_heads(heads)(qkv)
    out = causal_attention(q, k, v, precision).transpose(0, 2, 1, 3).reshape(batch, time, width)
    return _dense(params, prefix + "c_proj", out, precision, branch)


def _rounded_as_autocast(precision: str):
    """bf16 where the program being traced is `bf16` for XLA on CUDA, else None: the dtype
    of the activations that torch.autocast keeps in bf16 and only a bf16 product reads or
    a product makes for the residual stream (layer norm's output, with the gradient that
    comes back to it; each residual branch's output; the logits, whose cross-entropy is
    still taken in float32). Each halves the bytes of a [tokens, width] (or [tokens,
    vocabulary]) tensor written and read back, for a rounding of 2⁻⁹ of each value."""
    import jax.numpy as jnp

    return jnp.bfloat16 if precision == "bf16" and xla_on_cuda() else None


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
    needs only the block's own. For XLA on CUDA each layer norm is folded into the
    product after it (`_normed`), and the residual stream's gradient is kept apart from
    layer norm's backward pass (`layers.kept_gradient`)."""
    branch = _rounded_as_autocast(precision)
    normed = functools.partial(
        _normed,
        params,
        out_dtype="float32" if branch is None else "bfloat16",
        fold=xla_on_cuda(),
    )
    residual = layers.kept_gradient() if xla_on_cuda() else (lambda x: x)
    h, block = normed(prefix + "ln_1", prefix + "attn.c_attn", x)
    x = residual(x + _attention(config, block, prefix + "attn.", h, precision))
    h, block = normed(prefix + "ln_2", prefix + "mlp.c_fc", x)
    h = _dense_gelu(block, prefix + "mlp.c_fc", h, precision)
    return residual(x + _dense(params, prefix + "mlp.c_proj", h, precision, branch))


def logits(config: Mapping[str, int], params: Params, tokens, precision: str = "f32"):
    """Logits [batch, time, vocabulary] of `tokens` [batch, time]. For XLA on CUDA the
    positions' gradient is summed over the batch by adds (`layers.add_positions`)."""
    import jax

    time = tokens.shape[1]
    add = layers.add_positions() if xla_on_cuda() else operator.add
    x = add(embedding.embedding(precision)(params["wte"], tokens), params["wpe"][:time])
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
    in_bf16 = _rounded_as_autocast(precision) is not None
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
        h = gelu.gelu("f32")(_dense(params, p + "mlp.c_fc", h, "f32"))
        x = x + _dense(params, p + "mlp.c_proj", h, "f32")
    x = jax.lax.dynamic_index_in_dim(x, last, axis=1, keepdims=False)
    x = layers.layer_norm()(x, params["ln_f.weight"], params["ln_f.bias"])
    return jnp.einsum("bd,vd->bv", x, params["wte"]), cache  # no transposed copy of wte


def loss(config: Mapping[str, int], params: Params, tokens, targets, precision: str = "f32"):
    """Mean cross-entropy of next-character prediction."""
    mean_loss = losses.cross_entropy_in_one_pass() if xla_on_cuda() else losses.cross_entropy()
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
