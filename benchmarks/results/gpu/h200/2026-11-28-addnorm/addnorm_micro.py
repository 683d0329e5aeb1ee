"""The residual add and layer norm of GPT-2 small at batch 16 ([16384, 768], float32 stream,
bf16 branch and output) as XLA fuses it from plain jnp, against one Pallas (Triton) kernel
that reads each row once (issue 32). Prints µs a call and the kernels' largest errors, and
writes them to the JSON file named by its argument.

    python addnorm_micro.py micro.json      # on a CUDA machine
"""

import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

ROWS, WIDTH, BLOCK = 16 * 1024, 768, 1024  # a block holds Triton's power of two


def xla_form(x, branch, weight, bias):
    total = x + branch.astype(jnp.float32)
    mean = jnp.mean(total, axis=-1, keepdims=True)
    square = jnp.mean(total * total, axis=-1, keepdims=True)
    inverse_std = 1.0 / jnp.sqrt(jnp.maximum(square - mean * mean, 0.0) + 1e-5)
    out = ((total + (-mean)) * inverse_std * weight + bias).astype(jnp.bfloat16)
    return total, out, mean, inverse_std


def pallas_form(rows: int, warps: int):
    def kernel(x_ref, branch_ref, weight_ref, bias_ref, total_ref, out_ref, mean_ref, std_ref):
        inside = jax.lax.broadcasted_iota(jnp.int32, (rows, BLOCK), 1) < WIDTH
        column = jax.lax.broadcasted_iota(jnp.int32, (1, BLOCK), 1) < WIDTH
        total = plt.load(x_ref, mask=inside, other=0.0)
        total = total + plt.load(branch_ref, mask=inside, other=0.0).astype(jnp.float32)
        mean = jnp.sum(total, axis=1, keepdims=True) * (1.0 / WIDTH)
        square = jnp.sum(total * total, axis=1, keepdims=True) * (1.0 / WIDTH)
        inverse_std = jax.lax.rsqrt(jnp.maximum(square - mean * mean, 0.0) + 1e-5)
        scale = plt.load(weight_ref, mask=column, other=0.0)
        shift = plt.load(bias_ref, mask=column, other=0.0)
        out = ((total - mean) * inverse_std * scale + shift).astype(jnp.bfloat16)
        plt.store(total_ref, total, mask=inside)
        plt.store(out_ref, out, mask=inside)
        mean_ref[...] = mean
        std_ref[...] = inverse_std

    by_rows = pl.BlockSpec((rows, BLOCK), lambda i: (i, 0))
    columns = pl.BlockSpec((1, BLOCK), lambda i: (0, 0))
    statistics = pl.BlockSpec((rows, 1), lambda i: (i, 0))
    shapes = [
        jax.ShapeDtypeStruct((ROWS, WIDTH), jnp.float32),
        jax.ShapeDtypeStruct((ROWS, WIDTH), jnp.bfloat16),
        jax.ShapeDtypeStruct((ROWS, 1), jnp.float32),
        jax.ShapeDtypeStruct((ROWS, 1), jnp.float32),
    ]
    return pl.pallas_call(
        kernel,
        grid=(ROWS // rows,),
        in_specs=[by_rows, by_rows, columns, columns],
        out_specs=[by_rows, by_rows, statistics, statistics],
        out_shape=shapes,
        compiler_params=plt.CompilerParams(num_warps=warps),
    )


def timed(function, args, calls: int = 200) -> tuple[float, list]:
    """Median µs a call over 5 × `calls` jitted calls, and the outputs."""
    function = jax.jit(function)
    out = jax.block_until_ready(function(*args))
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            out = function(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return float(np.median(samples)), out


def main() -> None:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((ROWS, WIDTH)) * 3 + 0.5, jnp.float32)
    branch = jnp.asarray(rng.standard_normal((ROWS, WIDTH)), jnp.bfloat16)
    weight = jnp.asarray(rng.standard_normal((1, WIDTH)) * 0.1 + 1, jnp.float32)
    bias = jnp.asarray(rng.standard_normal((1, WIDTH)) * 0.1, jnp.float32)
    args = (x, branch, weight, bias)
    reference_us, reference = timed(xla_form, args)
    results = {"xla": {"us": reference_us}}
    print("xla", reference_us, flush=True)
    for rows in (2, 4, 8):
        for warps in (4, 8, 16):
            us, out = timed(pallas_form(rows, warps), args)
            errors = [
                float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
                for a, b in zip(out, reference, strict=True)
            ]
            results[f"pallas r{rows} w{warps}"] = {"us": us, "max_abs_err": errors}
            print(rows, warps, us, errors, flush=True)
    Path(sys.argv[1]).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
