"""How long GPT-2 small's clip + AdamW update takes alone on the GPU, in three forms:

- `pcp`: PCP's AdamW (`pcp_adamw.build`) over the tree of 148 parameters, as the step
  applies it (updates added to the parameters), jitted with the state donated;
- `flat`: the same arithmetic over one flat float32 vector of all parameters (a 0/1
  vector says which entries are decayed): one elementwise pass and one norm;
- `torch`: `clip_grad_norm_` (foreach) and `torch.optim.AdamW(fused=True)` on the same
  shapes, PCP's settings.

The question (issue 32): is the optimizer where PCP's step at batch 16 spends the
millisecond it trails torch.compile by in "the rest" of its kernels? Prints a JSON line
of median ms per update over `--calls` updates after warm-up.
"""

import argparse
import json
import statistics
import time

import numpy as np

from pcp_core.optimizers import InnerSettings
from pcp_core.program import nanogpt

CONFIG = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab_size": 50304}


def timed(update, calls: int, sync) -> float:
    for _ in range(3):
        update()
    sync()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        update()
        sync()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def jax_forms(params: dict[str, np.ndarray], calls: int) -> dict[str, float]:
    import jax
    import jax.numpy as jnp
    import pcp_adamw

    optimizer = pcp_adamw.build(InnerSettings())
    tree = {k: jnp.asarray(v) for k, v in params.items()}
    grads = {
        k: jnp.asarray(np.random.default_rng(1).standard_normal(v.shape, np.float32) * 1e-3)
        for k, v in params.items()
    }

    @donated_jit
    def tree_step(p, s, g):
        updates, s = optimizer.update(g, s, p)
        return jax.tree_util.tree_map(jnp.add, p, updates), s

    state = jax.tree_util.tree_map(jnp.copy, optimizer.init(tree))  # mu, nu: one zeros
    box = {"p": tree, "s": state}

    def run_tree():
        box["p"], box["s"] = tree_step(box["p"], box["s"], grads)

    results = {"pcp": timed(run_tree, calls, lambda: jax.block_until_ready(box["p"]))}

    flat_p = jnp.concatenate([v.ravel() for v in params.values()])
    flat_g = jnp.concatenate([v.ravel() for v in grads.values()])
    decayed = jnp.concatenate(
        [jnp.full(v.size, 1.0 if v.ndim >= 2 else 0.0, jnp.float32) for v in params.values()]
    )
    b1, b2, eps, wd, lr = 0.9, 0.99, 1e-8, 0.1, 1e-3

    @donated_jit
    def flat_step(p, m, v, count, g):
        count = count + 1
        steps = count.astype(jnp.float32)
        scale = jnp.minimum(1.0, 1.0 / (jnp.sqrt(jnp.sum(g * g)) + 1e-6))
        m = b1 * m + ((1 - b1) * scale) * g
        v = b2 * v + (((1 - b2) * scale * scale) * g) * g
        direction = (m / (1 - b1**steps)) / (jnp.sqrt(v / (1 - b2**steps)) + eps)
        return p - lr * (direction + wd * decayed * p), m, v, count

    flat = {
        "p": flat_p,
        "m": jnp.zeros_like(flat_p),
        "v": jnp.zeros_like(flat_p),
        "c": jnp.zeros([], jnp.int32),
    }

    def run_flat():
        flat["p"], flat["m"], flat["v"], flat["c"] = flat_step(
            flat["p"], flat["m"], flat["v"], flat["c"], flat_g
        )

    results["flat"] = timed(run_flat, calls, lambda: jax.block_until_ready(flat["p"]))
    return results


def donated_jit(function):
    import jax

    return jax.jit(function, donate_argnums=(0, 1))


def torch_form(params: dict[str, np.ndarray], calls: int) -> dict[str, float]:
    import torch

    device = torch.device("cuda")
    tensors = [torch.nn.Parameter(torch.from_numpy(v).to(device)) for v in params.values()]
    for t in tensors:
        t.grad = torch.randn_like(t) * 1e-3
    groups = [
        {"params": [t for t in tensors if t.ndim >= 2], "weight_decay": 0.1},
        {"params": [t for t in tensors if t.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99), eps=1e-8, fused=True)

    def run():
        torch.nn.utils.clip_grad_norm_(tensors, 1.0, foreach=True)
        optimizer.step()

    return {"torch": timed(run, calls, torch.cuda.synchronize)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    params = nanogpt.init(nanogpt.MODEL.config(CONFIG), 0)
    sizes = sum(v.size for v in params.values())
    row = {"parameters": int(sizes), "tensors": len(params)}
    row |= jax_forms(params, args.calls)
    try:
        row |= torch_form(params, args.calls)
    except (ImportError, RuntimeError, AssertionError) as error:  # no torch, or no CUDA
        row["torch"] = repr(error)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
