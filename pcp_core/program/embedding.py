"""The token embedding, `wte[tokens]`, with a gradient that needs no atomics.

Autodiff of the gather gives a scatter-add of every position's row into the few rows of
`wte`: with repeated tokens IREE serialises it on GPU targets, where it was over a
quarter of a GPT step, and XLA runs it fast but with atomics, so two runs of a step
would differ in the last bits. Both forms here give the same bits each run.
"""

import functools

from pcp_core.program import precision as precisions
from pcp_core.program.layers import one_hot_add
from pcp_core.program.platform_export import xla_on_cuda


@functools.cache
def embedding(precision: str):
    """`wte[tokens]`, whose gradient is the product one_hot(tokens)ᵀ · g.

    As a product it runs on the matrix units like any other; its cost is that of one
    output-head product, and the one-hot matrix is the size of the logits the output
    head already makes. XLA on CUDA sums each token's rows instead
    (`sorted_embedding_gradient`): a product as large as the output head's is a lot of
    arithmetic for a few MB of sums.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    def forward(wte, tokens):
        return wte[tokens], (tokens, wte.shape[0])

    def backward(residuals, g):
        tokens, vocab = residuals
        rows = tokens.reshape(-1)
        if xla_on_cuda():
            grad = sorted_embedding_gradient(rows, g.reshape(rows.size, -1), vocab)
            return grad, np.zeros(tokens.shape, jax.dtypes.float0)
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
