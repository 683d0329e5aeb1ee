"""The built-in model: a character-level GPT (after nanoGPT) in plain JAX.

Pre-norm transformer blocks, causal self-attention, GELU MLP, weights tied between
the token embedding and the output head.
"""

import functools
import math
from collections.abc import Mapping

from pcp_core.models import Model, Params

DEFAULTS = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 64, "vocab_size": 256}


def validate(config: Mapping[str, int]) -> None:
    for key, value in config.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"model setting {key} must be a positive integer, got {value!r}")
    if config["n_embd"] % config["n_head"]:
        raise ValueError(
            f"n_embd ({config['n_embd']}) must be divisible by n_head ({config['n_head']})"
        )


def init(config: Mapping[str, int], seed: int) -> Params:
    """Parameters in a fixed order (the order the wire and checkpoints use)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    width, layers = config["n_embd"], config["n_layer"]
    std, proj_std = 0.02, 0.02 / math.sqrt(2 * layers)

    def normal(shape: tuple[int, ...], scale: float = std) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    params: Params = {
        "wte": normal((config["vocab_size"], width)),
        "wpe": normal((config["block_size"], width)),
    }
    for i in range(layers):
        p = f"h.{i}."
        params[p + "ln_1.weight"] = np.ones(width, np.float32)
        params[p + "ln_1.bias"] = np.zeros(width, np.float32)
        params[p + "attn.c_attn.weight"] = normal((width, 3 * width))
        params[p + "attn.c_attn.bias"] = np.zeros(3 * width, np.float32)
        params[p + "attn.c_proj.weight"] = normal((width, width), proj_std)
        params[p + "attn.c_proj.bias"] = np.zeros(width, np.float32)
        params[p + "ln_2.weight"] = np.ones(width, np.float32)
        params[p + "ln_2.bias"] = np.zeros(width, np.float32)
        params[p + "mlp.c_fc.weight"] = normal((width, 4 * width))
        params[p + "mlp.c_fc.bias"] = np.zeros(4 * width, np.float32)
        params[p + "mlp.c_proj.weight"] = normal((4 * width, width), proj_std)
        params[p + "mlp.c_proj.bias"] = np.zeros(width, np.float32)
    params["ln_f.weight"] = np.ones(width, np.float32)
    params["ln_f.bias"] = np.zeros(width, np.float32)
    return params


def _layer_norm(x, weight, bias, eps: float = 1e-5):
    import jax.numpy as jnp

    mean = jnp.mean(x, axis=-1, keepdims=True)
    # Not `x - mean`: its gradient is sum(-g) over the feature axis, and IREE turns a
    # sum of a negation into a subtracting reduction it cannot tile on GPU targets
    # ("Failed to get an identity value for the reduction operation"). Negating the
    # [..., 1] mean instead puts the negation after the sum; the values are identical.
    centred = x + (-mean)
    variance = jnp.mean(centred * centred, axis=-1, keepdims=True)
    return centred * (1.0 / jnp.sqrt(variance + eps)) * weight + bias


def _attention(config: Mapping[str, int], params: Params, prefix: str, x):
    import jax
    import jax.numpy as jnp

    batch, time, width = x.shape
    heads = config["n_head"]
    qkv = x @ params[prefix + "c_attn.weight"] + params[prefix + "c_attn.bias"]
    q, k, v = jnp.split(qkv, 3, axis=-1)

    def split_heads(t):
        return t.reshape(batch, time, heads, width // heads).transpose(0, 2, 1, 3)

    q, k, v = split_heads(q), split_heads(k), split_heads(v)
    scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(width // heads))
    causal = jnp.tril(jnp.ones((time, time), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    out = jax.nn.softmax(scores, axis=-1) @ v
    out = out.transpose(0, 2, 1, 3).reshape(batch, time, width)
    return out @ params[prefix + "c_proj.weight"] + params[prefix + "c_proj.bias"]


def logits(config: Mapping[str, int], params: Params, tokens):
    import jax

    time = tokens.shape[1]
    x = params["wte"][tokens] + params["wpe"][:time]
    for i in range(config["n_layer"]):
        p = f"h.{i}."
        h = _layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"])
        x = x + _attention(config, params, p + "attn.", h)
        h = _layer_norm(x, params[p + "ln_2.weight"], params[p + "ln_2.bias"])
        h = jax.nn.gelu(h @ params[p + "mlp.c_fc.weight"] + params[p + "mlp.c_fc.bias"])
        x = x + h @ params[p + "mlp.c_proj.weight"] + params[p + "mlp.c_proj.bias"]
    x = _layer_norm(x, params["ln_f.weight"], params["ln_f.bias"])
    return x @ params["wte"].T


@functools.cache
def _cross_entropy():
    """Mean cross-entropy of logits [..., vocab] against integer targets [...].

    With a hand-written gradient, (softmax - one_hot) * g / N: autodiff of log_softmax
    sums a negated cotangent, which IREE cannot compile for GPU targets (see
    `_layer_norm`), and a one-hot built by comparing with an iota fails SPIR-V
    lowering, so the one-hot part is a scatter-add of -1.
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
        probs = jnp.exp(shifted - log_total)
        index = jnp.indices(targets.shape, sparse=True)
        grad = probs.at[(*index, targets)].add(-1.0)
        return grad * (g / targets.size), np.zeros(targets.shape, jax.dtypes.float0)

    cross_entropy = jax.custom_vjp(lambda logits, targets: forward(logits, targets)[0])
    cross_entropy.defvjp(forward, backward)
    return cross_entropy


def loss(config: Mapping[str, int], params: Params, tokens, targets):
    """Mean cross-entropy of next-character prediction."""
    return _cross_entropy()(logits(config, params, tokens), targets)


MODEL = Model(
    name="nanogpt",
    defaults=DEFAULTS,
    init=init,
    loss=loss,
    validate=validate,
    description="character-level GPT (nanoGPT) in plain JAX",
)
