"""The portable attention with its queries in blocks of each given size, side by side.

The same train step with `portable_attention.QUERY_BLOCK` set to each block, on a PCP
backend and jax.jit in one process. A block as long as the context is the whole causal
square (the form before blocks); shorter blocks skip more of its upper part, in more,
smaller products. Each row is `step_time.measure` of that form. Writes
RESULTS/attention_blocks_SIZE_BACKEND.json and .md.

    python benchmarks/attention_blocks.py --backend cpu --size long-tiny --blocks 1024 512 256
    python benchmarks/attention_blocks.py --backend cuda --target sm_80 --size gpt2-small \
        --precision bf16 --blocks 1024 512 256 --vmfb-dir vmfb --compile-only   # here
    python benchmarks/attention_blocks.py --backend cuda --size gpt2-small \
        --precision bf16 --blocks 1024 512 256 --vmfb-dir vmfb                  # on the GPU
"""

import argparse
import json
import os
from pathlib import Path

import step_time

from pcp_core import plugins
from pcp_core.config import PRECISIONS
from pcp_core.data import text as data
from pcp_core.program import portable_attention
from pcp_core.registry import UnknownNameError

# GPT-2 small's context on models a 2-core CPU steps through in seconds: a narrow one,
# where attention is most of the step, and shakespeare-char's layers
step_time.SIZES["long-tiny"] = {
    "model": {"n_layer": 2, "n_head": 4, "n_embd": 128, "block_size": 1024},
    "batch_size": 4,
    "steps_per_call": 2,
    "calls": 4,
}
step_time.SIZES["long-mid"] = {
    "model": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 1024},
    "batch_size": 2,
    "steps_per_call": 1,
    "calls": 3,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cpu", help="the PCP backend to time (IREE or xla)")
    parser.add_argument(
        "--size", choices=list(step_time.SIZES), default="long-tiny", help="the model and batch"
    )
    parser.add_argument("--precision", choices=PRECISIONS, default="f32")
    parser.add_argument(
        "--blocks",
        nargs="+",
        type=int,
        required=True,
        help="queries per block, one form each (the context or more: the whole square)",
    )
    parser.add_argument("--target", help="architecture to compile for (default: detect)")
    parser.add_argument("--vmfb-dir", type=Path, help="modules compiled by --compile-only")
    parser.add_argument("--compile-only", action="store_true", help="fill --vmfb-dir, run none")
    parser.add_argument("--results", type=Path, default=step_time.RESULTS, help="where figures go")
    args = parser.parse_args()
    if args.compile_only and not args.vmfb_dir:
        parser.error("--compile-only needs --vmfb-dir")
    if any(block < 1 for block in args.blocks):
        parser.error("--blocks: a block holds one query or more")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        backend = plugins.host().backend(args.backend)
    except UnknownNameError as error:
        parser.error(str(error))
    corpus = None if args.compile_only else data.load_text_file(None)
    rows = []
    for block in args.blocks:
        portable_attention.QUERY_BLOCK = block  # the program measure or compile_into builds
        vmfb_dir = args.vmfb_dir / f"block{block}" if args.vmfb_dir else None
        if args.compile_only:
            arch = backend.resolve_arch(args.target)
            step_time.compile_into(vmfb_dir, args.size, args.precision, backend, arch)
            continue
        row = step_time.measure(args.size, args.precision, corpus, backend, vmfb_dir)
        rows.append({"query_block": block, **row})
        print(
            f"block {block}: {args.backend} {row['backend_ms_per_step']} ms, "
            f"jax.jit {row['jax_ms_per_step']} ms, loss {row['final_loss_backend']:.4f}",
            flush=True,
        )
    if rows:
        write_results(args.results, args.backend, rows)


def write_results(results: Path, backend: str, rows: list[dict]) -> None:
    results.mkdir(parents=True, exist_ok=True)
    first = rows[0]
    stem = results / f"attention_blocks_{first['size']}_{backend}"
    stem.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    lines = [
        f"The portable attention's query blocks: {first['size']} {first['precision']}, "
        f"batch {first['batch_size']}, {backend} and jax.jit, ms per step (median)\n",
        f"| queries per block | {backend} | jax.jit | loss {backend} / jax.jit |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['query_block']} | {r['backend_ms_per_step']} | {r['jax_ms_per_step']} "
        f"| {r['final_loss_backend']:.4f} / {r['final_loss_jax']:.4f} |"
        for r in rows
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
