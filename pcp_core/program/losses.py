"""The built-in model's loss: mean cross-entropy with a hand-written gradient, in the
form IREE compiles for GPUs or, in the export for XLA on CUDA, in one pass."""

import functools

from pcp_core.program import layers


@functools.cache
def cross_entropy():
    """Mean cross-entropy of logits [..., vocab] against integer targets [...].

    With a hand-written gradient, (softmax - one_hot) * g / N: autodiff of log_softmax
    sums a negated cotangent, which IREE cannot compile for GPU targets (see
    `layers.layer_norm`); the one-hot part is a scatter-add of -1 (see `layers.one_hot_add`).
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
        grad = layers.one_hot_add(jnp.exp(shifted - log_total), targets, -1.0)
        return grad * (g / targets.size), np.zeros(targets.shape, jax.dtypes.float0)

    cross_entropy = jax.custom_vjp(lambda logits, targets: forward(logits, targets)[0])
    cross_entropy.defvjp(forward, backward)
    return cross_entropy


@functools.cache
def cross_entropy_in_one_pass():
    """`cross_entropy` as XLA computes it best: the backward pass recomputes the
    softmax from the logits (kept anyway: a product wrote them) and the log of its sum,
    and marks the targets by comparing with an iota, so exp, the one-hot and the
    scaling are one elementwise pass that writes the gradient in the logits' dtype.
    The scatter of `cross_entropy` split that pass in three around it, and its kept
    `shifted` logits were one more logits-sized tensor written and read back. The
    log-sum-exp reads the logits once (`logsumexp_in_one_pass`).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    def forward(logits, targets):
        x = logits.astype(jnp.float32)
        log_total = logsumexp_in_one_pass(x)
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


def logsumexp_in_one_pass(x):
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
