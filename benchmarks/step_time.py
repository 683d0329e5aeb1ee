"""A PCP backend against jax.jit (XLA) for the same train step, side by side in one process.

The backend is an IREE one (cpu, cuda, ...) or `xla` (pcp-xla: the step exported with
jax.export and run through PCP's executor, which should match jax.jit). Both run the
identical program (K steps of nanoGPT + AdamW per call) on the same
batches, at each `--precision` (see pcp_core/program/precision.py); the figure is the median
time per step, and the final losses and parameters of the two are compared. XLA runs
on JAX's default device: the CPU on a CPU machine, the GPU where JAX has one; on a GPU
its f32 rows run at full f32 (`highest`), with XLA's TF32 default beside them. Writes
benchmarks/results/step_time[_BACKEND].json and .md.

    python benchmarks/step_time.py                     # CPU: default + shakespeare-char
    python benchmarks/step_time.py --quick             # CPU: default model only
    python benchmarks/step_time.py --backend cuda --sizes gpt-b32 --precision f32 bf16
    python benchmarks/step_time.py --backend xla --sizes gpt-b32 --precision f32 bf16

A GPU machine without the IREE compiler runs modules compiled elsewhere:

    python benchmarks/step_time.py --backend cuda --target sm_80 --sizes gpt-b32 \
        --precision f32 bf16 --vmfb-dir vmfb --compile-only      # here: compile
    python benchmarks/step_time.py --backend cuda --sizes gpt-b32 \
        --precision f32 bf16 --vmfb-dir vmfb                     # there: run
"""

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from pcp_diloco.settings import DEFAULTS_BY_WORKERS

from pcp_core import plugins
from pcp_core.backends import Backend, set_opt_tensors_through_host, zero_opt_tensors
from pcp_core.config import PRECISIONS
from pcp_core.data import text as data
from pcp_core.iree.compiler import compile_program
from pcp_core.iree.executor import IreeExecutor, to_host
from pcp_core.iree.malloc import retaining_env
from pcp_core.optimizers import InnerSettings, schedule_values
from pcp_core.program import nanogpt
from pcp_core.program.build import build_train_program

RESULTS = Path(__file__).parent / "results"
# H of one or two workers, for a round start's share
DILOCO_ROUND_STEPS = DEFAULTS_BY_WORKERS[0].inner_steps

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
    # GPT-2 small (124M parameters with GPT-2's vocabulary, padded to 50304) at batch 8:
    # the tokens per step of gpt-b32, four times the context
    "gpt2-small": {
        "model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024},
        "vocab_size": 50304,
        "batch_size": 8,
        "steps_per_call": 4,
        "calls": 3,
    },
}
# GPT-2 medium (350M), large (774M) and XL (1.5B), nanogpt's presets, likewise
SIZES |= {
    name: {**SIZES["gpt2-small"], "model": nanogpt.PRESETS[name]}
    for name in ("gpt2-medium", "gpt2-large", "gpt2-xl")
}


def build(size: dict, corpus: data.CharCorpus, precision: str, steps_per_call: int):
    import pcp_adamw

    # a size may set a vocabulary larger than the corpus's: its batches use part of it
    vocab_size = size.get("vocab_size", corpus.vocab_size)
    config = nanogpt.MODEL.config({**size["model"], "vocab_size": vocab_size})
    program = build_train_program(  # the schedule as state, as `pcp train` builds it
        nanogpt.MODEL,
        config,
        pcp_adamw.build(InnerSettings()),
        steps_per_call=steps_per_call,
        batch_size=size["batch_size"],
        precision=precision,
        schedule=schedule_values(InnerSettings()),
    )
    return config, program


def module_path(vmfb_dir: Path, name: str, precision: str, backend: Backend, k: int) -> Path:
    return vmfb_dir / f"{name}-{precision}-k{k}-{backend.name}.vmfb"


def compile_into(vmfb_dir: Path, name: str, precision: str, backend: Backend, arch: str) -> None:
    """Compile the step (and its one-step form, for kernel profiles) into `vmfb_dir`."""
    corpus = data.load_text_file(None)
    for k in sorted({SIZES[name]["steps_per_call"], 1}):
        _, program = build(SIZES[name], corpus, precision, k)
        stablehlo = program.stablehlo_for(backend.runtime.unroll_steps)
        compiled = compile_program(stablehlo, backend, arch)
        vmfb_dir.mkdir(parents=True, exist_ok=True)
        module_path(vmfb_dir, name, precision, backend, k).write_bytes(compiled.vmfb)
        print(f"compiled {name} {precision} K={k} for {backend.name} {arch}")


def relative_difference(ours: list[np.ndarray], theirs: list) -> float:
    """‖ours − theirs‖ / ‖theirs‖ over all the parameters together."""
    pairs = [(a, np.asarray(b)) for a, b in zip(ours, theirs, strict=True)]
    difference = sum(float(np.sum((a - b) ** 2)) for a, b in pairs)
    return (difference / sum(float(np.sum(b**2)) for _, b in pairs)) ** 0.5


def timed_steps(step, state, batches, k: int, precision_context) -> tuple[list[float], Any]:
    import jax

    times = []
    with precision_context:
        for call, (x, y) in enumerate(batches):  # call 0 warms up
            started = time.perf_counter()
            *state, loss = step(*state, x, y)
            loss = np.asarray(jax.block_until_ready(loss))
            if call:
                times.append((time.perf_counter() - started) / k)
    return times, (state, loss)


def measure(
    name: str, precision: str, corpus: data.CharCorpus, backend: Backend, vmfb_dir: Path | None
) -> dict:
    import jax

    size = SIZES[name]
    k, batch, calls = size["steps_per_call"], size["batch_size"], size["calls"]
    config, program = build(size, corpus, precision, k)
    arch = backend.resolve_arch()
    if vmfb_dir:
        artifact = module_path(vmfb_dir, name, precision, backend, k).read_bytes()
    else:
        artifact = backend.runtime.build(program, backend, arch).data
    executor = backend.runtime.open(artifact, backend, program, None)
    params = list(nanogpt.init(config, 0).values())
    opt_state = program.init_opt_state(params)
    executor.set_params(params)
    executor.set_opt_state(opt_state)
    batches = [
        corpus.batches("train", k, batch, config["block_size"], (0, c)) for c in range(calls + 1)
    ]

    backend_times = []
    for call, (x, y) in enumerate(batches):  # call 0 warms up
        started = time.perf_counter()
        backend_loss = executor.run(x, y)
        if call:
            backend_times.append((time.perf_counter() - started) / k)
    on_gpu = jax.default_backend() != "cpu"
    full_f32 = jax.default_matmul_precision("highest" if precision == "f32" else None)
    start = (tuple(params), tuple(opt_state))
    jax_times, ((jax_params, _), jax_loss) = timed_steps(
        program.jax_step, start, batches, k, full_f32
    )
    ours_ms, jax_ms = statistics.median(backend_times) * 1e3, statistics.median(jax_times) * 1e3
    row = {
        "size": name,
        "precision": precision,
        "backend": backend.name,
        "arch": arch,
        "compile_flags": (
            backend.runtime.compile_flags(arch) if backend.runtime.kind == "iree-vmfb" else []
        ),
        "model": config,
        "batch_size": batch,
        "steps_per_call": k,
        "parameters": int(sum(p.size for p in params)),
        "backend_ms_per_step": round(ours_ms, 2),
        "jax_ms_per_step": round(jax_ms, 2),
        "xla_over_backend": round(jax_ms / ours_ms, 3),
        "final_loss_backend": float(backend_loss[-1]),
        "final_loss_jax": float(jax_loss[-1]),
        "params_relative_difference": relative_difference(executor.params(), jax_params),
    }
    row |= time_round_start(executor, program, params)  # sets the parameters back: last
    for way in ("momentum_reset", "momentum_reset_through_host"):
        row[f"{way}_share_of_round"] = round(row[f"{way}_ms"] / (DILOCO_ROUND_STEPS * ours_ms), 5)
    if on_gpu and precision == "f32":  # XLA's default on a GPU: TF32 matrix products
        tf32_times, _ = timed_steps(
            program.jax_step, start, batches, k, jax.default_matmul_precision(None)
        )
        row["jax_tf32_ms_per_step"] = round(statistics.median(tf32_times) * 1e3, 2)
    return row


def time_round_start(executor: Any, program: Any, params: list[np.ndarray]) -> dict:
    """What a DiLoCo worker does to the backend around a round's steps, in ms (median of
    5): setting the global parameters, reading its own back at the end, and zeroing
    AdamW's first moment as `--inner-momentum reset` does, on the device and through the
    host side by side."""
    import pcp_adamw

    momentum = set(program.opt_field_names(pcp_adamw.ADAMW.momentum_field))
    work = {
        "set_params_ms": lambda: executor.set_params(params),
        "read_params_ms": executor.params,
        "momentum_reset_ms": lambda: zero_opt_tensors(executor, momentum),
        "momentum_reset_through_host_ms": lambda: set_opt_tensors_through_host(
            executor, dict.fromkeys(momentum, 0.0)
        ),
    }
    if isinstance(executor, IreeExecutor):  # side by side: the way params() read before
        n_params = len(executor.param_specs)
        work["read_params_one_by_one_ms"] = lambda: [
            to_host(a) for a in executor.device_state()[:n_params]
        ]
    times: dict[str, list[float]] = {name: [] for name in work}
    for _ in range(5):
        for name, action in work.items():
            started = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - started)
    zero_opt_tensors(executor, momentum)  # last, so what it left can be checked
    for spec, state in zip(executor.opt_specs, executor.opt_state(), strict=True):
        if spec.name in momentum and np.any(state):
            raise AssertionError(f"{spec.name} is not zero after zero_opt_tensors")
    return {name: round(statistics.median(t) * 1e3, 2) for name, t in times.items()}


def retain_freed_memory() -> None:
    """Re-execute this process with pcp_core.iree.malloc's settings (glibc reads them at start).

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
    parser.add_argument("--backend", default="cpu", help="the PCP backend to time (IREE or xla)")
    parser.add_argument(
        "--sizes", nargs="+", choices=list(SIZES), default=["default", "shakespeare-char"]
    )
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=["f32"])
    parser.add_argument("--target", help="architecture to compile for (default: detect)")
    parser.add_argument("--vmfb-dir", type=Path, help="modules compiled by --compile-only")
    parser.add_argument("--compile-only", action="store_true", help="fill --vmfb-dir, run none")
    parser.add_argument(
        "--extra-flag",
        action="append",
        default=[],
        help="an IREE compile flag to add: --extra-flag=--iree-... (repeatable)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where figures go")
    parser.add_argument("--system-malloc", action="store_true", help="glibc malloc defaults")
    args = parser.parse_args()
    if args.compile_only and not args.vmfb_dir:
        parser.error("--compile-only needs --vmfb-dir")
    if args.backend == "cpu" and not args.system_malloc:
        retain_freed_memory()
    # IREE and XLA share the GPU in this process: XLA must not take 75% of it up front
    # (its default), or a GPT-2-sized IREE step (27 GB of transients) cannot allocate.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    backend = plugins.host().backend(args.backend)
    if args.extra_flag:
        target = backend.runtime
        target = dataclasses.replace(target, extra_flags=(*target.extra_flags, *args.extra_flag))
        backend = dataclasses.replace(backend, runtime=target)
    names = ["default"] if args.quick else args.sizes
    runs = [(name, precision) for name in names for precision in args.precision]
    if args.compile_only:
        arch = backend.resolve_arch(args.target)
        for name, precision in runs:
            compile_into(args.vmfb_dir, name, precision, backend, arch)
        return
    corpus = data.load_text_file(None)
    rows = [measure(name, precision, corpus, backend, args.vmfb_dir) for name, precision in runs]
    write_results(args.results, args.backend, rows)


def write_results(results: Path, backend: str, rows: list[dict]) -> None:
    import jax

    machine = {
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "xla_device": str(jax.devices()[0].device_kind),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
    }
    results.mkdir(parents=True, exist_ok=True)
    stem = "step_time" if backend == "cpu" else f"step_time_{backend}"
    (results / f"{stem}.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    tf32 = any("jax_tf32_ms_per_step" in r for r in rows)
    lines = [
        f"PCP's {backend} backend against jax.jit (XLA) on {machine['xla_device']}, "
        "ms per step (median)\n",
        f"| size | precision | params | batch | {backend} | jax.jit | jax.jit/{backend} |"
        f"{' jax.jit TF32 |' if tf32 else ''} loss {backend} / jax.jit | params rel. diff |",
        f"|---|---|---|---|---|---|---|{'---|' if tf32 else ''}---|---|",
    ]
    lines += [
        f"| {r['size']} | {r['precision']} | {r['parameters']:,} | {r['batch_size']} "
        f"| {r['backend_ms_per_step']} | {r['jax_ms_per_step']} | {r['xla_over_backend']} |"
        + (f" {r.get('jax_tf32_ms_per_step', '')} |" if tf32 else "")
        + f" {r['final_loss_backend']:.4f} / {r['final_loss_jax']:.4f} "
        f"| {r['params_relative_difference']:.1e} |"
        for r in rows
    ]
    lines += [
        "",
        f"A DiLoCo worker's round on {backend}, beyond its steps, ms (median of 5): setting "
        "the global parameters, reading its own back (all at once, and a tensor at a time "
        "as before), and zeroing AdamW's first moment "
        "(`--inner-momentum reset`) on the device and through the host, with each "
        f"zeroing's share of a {DILOCO_ROUND_STEPS}-step round\n",
        "| size | precision | set params | read params | zero on the device "
        "| zero through the host |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['size']} | {r['precision']} | {r['set_params_ms']} | {r['read_params_ms']}"
        + (
            f" ({r['read_params_one_by_one_ms']} one by one)"
            if "read_params_one_by_one_ms" in r
            else ""
        )
        + " "
        f"| {r['momentum_reset_ms']} ({r['momentum_reset_share_of_round']:.2%}) "
        f"| {r['momentum_reset_through_host_ms']} "
        f"({r['momentum_reset_through_host_share_of_round']:.2%}) |"
        for r in rows
    ]
    if machine["glibc_tunables"]:
        lines.append(f"\nGLIBC_TUNABLES={machine['glibc_tunables']}")
    (results / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
