"""IREE against jax.jit (XLA) for the same train step, side by side in one process.

Both run the identical program (K steps of nanoGPT + AdamW per call) on the same
batches; the figure is the median time per step. XLA runs on JAX's default device: the
CPU on a CPU machine, the GPU where JAX has one. Writes
benchmarks/results/step_time[_BACKEND].json and .md.

    python benchmarks/step_time.py                     # CPU: default + shakespeare-char
    python benchmarks/step_time.py --quick             # CPU: default model only
    python benchmarks/step_time.py --backend cuda --sizes shakespeare-char gpt-b32
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from pcp_core import data, nanogpt, plugins
from pcp_core.backends import Backend
from pcp_core.compiler import compile_program
from pcp_core.executor import IreeExecutor
from pcp_core.malloc import retaining_env
from pcp_core.optimizers import InnerSettings
from pcp_core.program import build_train_program

RESULTS = Path(__file__).parent / "results"

SIZES = {
    "default": {"model": {}, "batch_size": 16, "steps_per_call": 10, "calls": 10},
    # nanoGPT's shakespeare-char model; batch 8 (not 64) so a 2-core machine finishes
    "shakespeare-char": {
        "model": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256},
        "batch_size": 8,
        "steps_per_call": 2,
        "calls": 4,
    },
    # the same model at batch 32, 10 steps per call: a GPU-sized step
    "gpt-b32": {
        "model": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256},
        "batch_size": 32,
        "steps_per_call": 10,
        "calls": 5,
    },
}


def measure(name: str, size: dict, corpus: data.CharCorpus, backend: Backend) -> dict:
    import jax
    import pcp_adamw

    config = nanogpt.MODEL.config({**size["model"], "vocab_size": corpus.vocab_size})
    k, batch, calls = size["steps_per_call"], size["batch_size"], size["calls"]
    program = build_train_program(
        nanogpt.MODEL, config, pcp_adamw.build(InnerSettings()), steps_per_call=k, batch_size=batch
    )
    arch = backend.resolve_arch()
    compiled = compile_program(program.stablehlo, backend, arch)
    executor = IreeExecutor(compiled.vmfb, backend.driver, program.param_specs, program.opt_specs)
    params = list(nanogpt.init(config, 0).values())
    opt_state = program.init_opt_state(params)
    executor.set_params(params)
    executor.set_opt_state(opt_state)
    jax_state = (tuple(params), tuple(opt_state))
    batches = [
        corpus.batches("train", k, batch, config["block_size"], (0, c)) for c in range(calls + 1)
    ]

    iree_times, jax_times = [], []
    for call, (x, y) in enumerate(batches):  # call 0 warms both up
        started = time.perf_counter()
        iree_loss = executor.run(x, y)
        iree_s = time.perf_counter() - started
        started = time.perf_counter()
        *jax_state, jax_loss = program.jax_step(*jax_state, x, y)
        jax_loss = np.asarray(jax.block_until_ready(jax_loss))
        jax_s = time.perf_counter() - started
        if call:
            iree_times.append(iree_s / k)
            jax_times.append(jax_s / k)
    iree_ms, jax_ms = statistics.median(iree_times) * 1e3, statistics.median(jax_times) * 1e3
    return {
        "size": name,
        "compile_flags": backend.compile_flags(arch),
        "model": config,
        "batch_size": batch,
        "steps_per_call": k,
        "parameters": int(sum(p.size for p in params)),
        "iree_ms_per_step": round(iree_ms, 2),
        "jax_ms_per_step": round(jax_ms, 2),
        "xla_over_iree": round(jax_ms / iree_ms, 3),
        "final_loss_iree": float(iree_loss[-1]),
        "final_loss_jax": float(jax_loss[-1]),
    }


def retain_freed_memory() -> None:
    """Re-execute this process with pcp_core.malloc's settings (glibc reads them at start).

    They save IREE ~45% of its CPU step time at shakespeare-char size and XLA ~10%; the
    single arena costs XLA ~20% on the default model and IREE nothing. `--system-malloc`
    measures with glibc's defaults.
    """
    env = retaining_env()
    if env.get("GLIBC_TUNABLES") != os.environ.get("GLIBC_TUNABLES"):
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the default model")
    parser.add_argument("--backend", default="cpu", help="PCP backend for the IREE side")
    parser.add_argument(
        "--sizes", nargs="+", choices=list(SIZES), default=["default", "shakespeare-char"]
    )
    parser.add_argument("--system-malloc", action="store_true", help="glibc malloc defaults")
    args = parser.parse_args()
    if args.backend == "cpu" and not args.system_malloc:
        retain_freed_memory()
    backend = plugins.host().backend(args.backend)
    corpus = data.load_text_file(None)
    names = ["default"] if args.quick else args.sizes
    rows = [measure(name, SIZES[name], corpus, backend) for name in names]
    machine = {
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
    }
    RESULTS.mkdir(exist_ok=True)
    stem = "step_time" if args.backend == "cpu" else f"step_time_{args.backend}"
    (RESULTS / f"{stem}.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    lines = [
        f"| size | params | batch | IREE {args.backend} ms/step | XLA ms/step | XLA/IREE |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['size']} | {r['parameters']:,} | {r['batch_size']} | {r['iree_ms_per_step']} "
        f"| {r['jax_ms_per_step']} | {r['xla_over_iree']} |"
        for r in rows
    ]
    if machine["glibc_tunables"]:
        lines.append(f"\nGLIBC_TUNABLES={machine['glibc_tunables']}")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
