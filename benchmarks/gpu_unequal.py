"""A GPU worker beside a CPU worker, rounds by time (issue 31 on the GPU machine).

Each run is a real `pcp shepherd` and real `pcp worker` processes on 127.0.0.1, each
pinned to its own cores (the shepherd one, the CPU worker the last half of the machine or
`run --cpu-cores N`, the GPU worker the rest), DiLoCo with `--round-budget auto` and
`--merge tokens`:

    alone      the GPU worker (`--backend xla`) alone
    pair       the GPU worker and an IREE `cpu` worker
    pair-xla   the GPU worker and an `xla` worker on the CPU platform (JAX_PLATFORMS=cpu)

It reports, per run, the wall time of training, tokens and tokens/s, each worker's
steps and compute utilisation, and the final validation loss; and for each pair run
its tokens/s and loss against `alone` of the same call. Writes <results>/<stem>.json
and .md with the command.

A machine without the IREE compiler (the GPU machine here) serves the `cpu` worker's
program from PCP's compile cache: `dump` runs the shepherd until the `cpu` worker
joins and writes the StableHLO it would compile; `prewarm` compiles that elsewhere into
a cache directory, which `run --cache` then hands to the shepherd (the cache key is the
program's text, the target, the flags and the IREE version, all the same there).

    python benchmarks/gpu_unequal.py dump --out DUMP -- FLAGS      # on the GPU machine
    python benchmarks/gpu_unequal.py prewarm DUMP --cache CACHE    # with the compiler
    python benchmarks/gpu_unequal.py run --cache CACHE --runs alone pair -- FLAGS
    python benchmarks/gpu_unequal.py curves alone=A/metrics.jsonl pair=B/metrics.jsonl

FLAGS (after `--`) go to `pcp shepherd` as they are: model, data, batch, H, steps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# each run's workers: name (its log, its cores) -> backend; the CPU one is on the CPU
WORKERS = {
    "alone": {"gpu": "xla"},
    "pair": {"gpu": "xla", "cpu": "cpu"},
    "pair-xla": {"gpu": "xla", "cpu": "xla"},
}
PORT = 47931


def cores(cpu_cores: int | None = None) -> dict[str, set[int]]:
    """Which cores each process may use: the shepherd one, the CPU worker the last
    `cpu_cores` (half the machine when None), the GPU worker the rest (XLA compiles its
    program as it joins, with a ptxas per kernel); on a machine of fewer than 6 cores (a
    trial run), all of them each. IREE's `local-task` driver (3.13) starts a worker
    thread for each core it may use, pinned to it, so `cpu_cores` is also the CPU
    worker's thread count."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 6:
        return {key: set(available) for key in ("shepherd", "gpu", "cpu")}
    cpu = len(available) // 2 if cpu_cores is None else cpu_cores
    if not 1 <= cpu <= len(available) - 2:
        raise SystemExit(f"--cpu-cores {cpu}: 1 to {len(available) - 2} on this machine")
    return {
        "shepherd": {available[0]},
        "gpu": set(available[1:-cpu]),
        "cpu": set(available[-cpu:]),
    }


def start(name: str, argv: list[str], run_dir: Path, pinned: set[int], env: dict[str, str]):
    with (run_dir / f"{name}.log").open("wb") as log:  # the child keeps its own copy
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            start_new_session=True,
            preexec_fn=lambda: os.sched_setaffinity(0, pinned),
        )


def stop(processes: dict[str, subprocess.Popen]) -> None:
    for process in processes.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
    for process in processes.values():
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


def launch(
    run: str,
    run_dir: Path,
    shepherd_flags: list[str],
    shepherd: list[str] | None = None,
    cpu_cores: int | None = None,
) -> dict[str, subprocess.Popen]:
    """Start the shepherd (`shepherd`: another command line for it) and the run's workers,
    the CPU worker on `cpu_cores` cores (`cores`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    token = run_dir / "token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    pinned = cores(cpu_cores)
    workers = WORKERS[run]
    argv = [
        *(shepherd or [sys.executable, "-m", "pcp_core"]),
        *("shepherd", "--algorithm", "diloco", "--backend", "xla", "--host", "127.0.0.1"),
        *("--port", str(PORT), "--workers", str(len(workers)), "--token-file", str(token)),
        *("--out", str(run_dir / "shepherd"), "--no-dashboard", "--overwrite"),
        *shepherd_flags,
    ]
    # the shepherd exports for the GPU and evaluates there; it must not take its memory
    common = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    processes = {"shepherd": start("shepherd", argv, run_dir, pinned["shepherd"], common)}
    time.sleep(3)
    for worker, backend in workers.items():
        env = dict(common)
        if worker == "cpu":
            env |= {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
        argv = [sys.executable, "-m", "pcp_core", "worker", "--connect", f"127.0.0.1:{PORT}"]
        argv += ["--backend", backend, "--token-file", str(token)]
        argv += ["--state-dir", str(run_dir / worker / "state"), "--timeout", "300"]
        processes[worker] = start(worker, argv, run_dir, pinned[worker], env)
    return processes


def run_one(
    run: str,
    run_dir: Path,
    shepherd_flags: list[str],
    timeout_s: float,
    cpu_cores: int | None = None,
) -> dict:
    processes = launch(run, run_dir, shepherd_flags, cpu_cores=cpu_cores)
    started = time.monotonic()
    try:
        while processes["shepherd"].poll() is None:
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"{run}: the shepherd ran past {timeout_s:.0f} s")
            time.sleep(1)
    finally:
        stop(processes)
    if processes["shepherd"].returncode != 0:
        tail = (run_dir / "shepherd.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{run}: the shepherd exited {processes['shepherd'].returncode}\n{tail}")
    return measure(run, run_dir)


def measure(run: str, run_dir: Path) -> dict[str, Any]:
    summary = json.loads((run_dir / "shepherd" / "summary.json").read_text())
    records = [
        json.loads(line)
        for line in (run_dir / "shepherd" / "metrics.jsonl").read_text().splitlines()
    ]
    steps: dict[str, int] = {}
    for record in records:
        for worker, count in record.get("worker_steps", {}).items():
            steps[worker] = steps.get(worker, 0) + count
    order = joined_order(run_dir, list(WORKERS[run]))
    return {
        "run": run,
        "rounds": len(records),
        "training_s": summary["training_s"],
        "wall_time_s": round(summary["wall_time_s"], 3),
        "tokens": summary["tokens"],
        "tokens_per_s": round(summary["tokens"] / summary["training_s"], 1),
        "final_val_loss": round(summary["final_val_loss"], 5),
        "workers": {
            order[index]: {
                "steps": steps.get(index, 0),
                "utilisation": summary["worker_utilisation"].get(index),
            }
            for index in summary["worker_utilisation"]
        },
        "budget_s": [record.get("budget_s") for record in records],
    }


def joined_order(run_dir: Path, names: list[str]) -> dict[str, str]:
    """Worker index → worker name. The shepherd numbers workers in the order they join,
    which is not the order they started in; each worker's log says its index."""
    order = {}
    for name in names:
        for line in (run_dir / f"{name}.log").read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == "joined":
                    order[str(event["index"])] = name
                    break
    return order


def table(results: list[dict[str, Any]], command: str) -> str:
    alone = next((r for r in results if r["run"] == "alone"), None)
    lines = [
        "| run | training s | tokens | tokens/s | vs alone | GPU util | CPU util | "
        "GPU steps | CPU steps | final val loss | vs alone |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        gpu = r["workers"].get("gpu", {})
        cpu = next((w for n, w in r["workers"].items() if n != "gpu"), {})
        speed = f"{r['tokens_per_s'] / alone['tokens_per_s']:.3f}×" if alone else ""
        loss = f"{r['final_val_loss'] / alone['final_val_loss'] - 1:+.2%}" if alone else ""
        lines.append(
            f"| {r['run']} | {r['training_s']:.1f} | {r['tokens']:,} | {r['tokens_per_s']:,.0f} "
            f"| {speed} | {gpu.get('utilisation', 0):.1%} | "
            f"{cpu.get('utilisation', 0) or 0:.1%} | {gpu.get('steps', '')} | "
            f"{cpu.get('steps', '')} | {r['final_val_loss']:.4f} | {loss} |"
        )
    return "\n".join([f"`{command}`", "", *lines, ""])


DUMP_SHEPHERD = """
import json, sys
from pathlib import Path
from pcp_core.backends import CompileError
from pcp_core.iree import runtime
out = Path(sys.argv.pop(1))
def dump(stablehlo, backend, arch):
    out.mkdir(parents=True, exist_ok=True)
    (out / "program.mlir").write_text(stablehlo)
    (out / "program.json").write_text(json.dumps({"backend": backend.name, "arch": arch}))
    raise CompileError("dumped for compiling elsewhere (benchmarks/gpu_unequal.py)")
runtime.compile_program = dump
from pcp_core.cli.app import main
sys.argv[0] = "pcp"
main()
"""


def dump(out: Path, shepherd_flags: list[str], timeout_s: float) -> None:
    """Run the shepherd until the `cpu` worker joins; keep the program it would compile."""
    for earlier in ("program.json", "program.mlir"):  # a dump of other flags
        (out / earlier).unlink(missing_ok=True)
    shepherd = [sys.executable, "-c", DUMP_SHEPHERD, str(out)]
    processes = launch("pair", out / "run", shepherd_flags, shepherd=shepherd)
    started = time.monotonic()
    try:
        while not (out / "program.json").exists():
            if time.monotonic() - started > timeout_s or processes["shepherd"].poll() is not None:
                raise SystemExit(f"no program dumped; see {out}/run/shepherd.log")
            time.sleep(1)
    finally:
        stop(processes)
    print(f"{out}/program.mlir: {json.loads((out / 'program.json').read_text())}")


def prewarm(dumped: Path, cache: Path) -> None:
    """Compile a dumped program into `cache`, as the shepherd would have."""
    cache.mkdir(parents=True, exist_ok=True)
    cache.chmod(0o700)
    os.environ["PCP_CACHE_DIR"] = str(cache)
    from pcp_core import plugins
    from pcp_core.iree.compiler import compile_program

    about = json.loads((dumped / "program.json").read_text())
    backend = plugins.host().backend(about["backend"])
    compiled = compile_program((dumped / "program.mlir").read_text(), backend, about["arch"])
    print(f"{cache}: {len(compiled.vmfb):,} bytes for {about}, cache hit {compiled.cache_hit}")


def validation_curve(metrics: Path) -> tuple[list[float], list[float], list[float]]:
    """Training seconds, tokens and validation loss at each evaluation of a run. Training
    starts where the first round's cycle began (`elapsed_s` counts from the shepherd's
    start, the program's compile included)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    start = rows[0]["elapsed_s"] - rows[0]["cycle_s"]
    evaluated = [r for r in rows if r.get("val_loss") is not None]
    if len(evaluated) < 2:
        raise SystemExit(f"{metrics}: fewer than two evaluations (train with --eval-every)")
    seconds = [r["elapsed_s"] - start for r in evaluated]
    return seconds, [r["tokens"] for r in evaluated], [r["val_loss"] for r in evaluated]


def curves(labelled: list[str], seconds: list[float], tokens: list[float]) -> str:
    """A table of each run's validation loss, interpolated between its evaluations, at
    the same training seconds and the same tokens (empty past a run's last one), and
    where the first run ended: the equal-time comparison at the longest time both have."""
    import numpy as np

    def at(x: float, xs: list[float], ys: list[float]) -> str:
        return f"{np.interp(x, xs, ys):.4f}" if xs[0] <= x <= xs[-1] else ""

    runs = {}
    for item in labelled:
        label, _, path = item.partition("=")
        runs[label] = validation_curve(Path(path))
    first, first_curve = next(iter(runs.items()))
    end = first_curve[0][-1]
    points = [(f"{first}'s end, {end:.1f} s", 0, end)]
    points += [(f"{s:g} s", 0, s) for s in seconds]
    points += [(f"{t / 1e6:g}M tokens", 1, t) for t in tokens]
    lines = ["| run | " + " | ".join(p[0] for p in points) + " |", "|---" * (len(points) + 1) + "|"]
    for label, curve in runs.items():
        cells = [at(x, curve[axis], curve[2]) for _, axis, x in points]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    flags: list[str] = []
    if "--" in argv:
        argv, flags = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train the runs and compare them")
    run.add_argument("--runs", nargs="+", choices=sorted(WORKERS), default=["alone", "pair"])
    run.add_argument("--cache", type=Path, help="PCP's compile cache (from prewarm)")
    run.add_argument("--out", type=Path, default=Path("/tmp/gpu_unequal"))
    run.add_argument("--results", type=Path, default=Path("benchmarks/results/gpu"))
    run.add_argument("--stem", default="unequal")
    run.add_argument("--timeout", type=float, default=400.0, help="seconds a run may take")
    run.add_argument(
        "--cpu-cores",
        type=int,
        help="cores of the CPU worker (the last ones; default half the machine); the GPU "
        "worker gets the others less the shepherd's",
    )
    dumping = commands.add_parser("dump", help="keep the program the cpu worker would get")
    dumping.add_argument("--out", type=Path, required=True)
    dumping.add_argument("--timeout", type=float, default=300.0)
    warming = commands.add_parser("prewarm", help="compile a dumped program into a cache")
    warming.add_argument("dumped", type=Path)
    warming.add_argument("--cache", type=Path, required=True)
    comparing = commands.add_parser(
        "curves", help="validation loss of runs at equal training time and equal tokens"
    )
    comparing.add_argument("metrics", nargs="+", help="LABEL=metrics.jsonl (with --eval-every)")
    comparing.add_argument("--seconds", type=float, nargs="+", default=[60, 90, 120])
    comparing.add_argument("--tokens", type=float, nargs="+", default=[20e6, 30e6])
    args = parser.parse_args(argv)
    if args.command == "curves":
        return print(curves(args.metrics, args.seconds, args.tokens))
    if args.command == "dump":
        return dump(args.out, flags, args.timeout)
    if args.command == "prewarm":
        return prewarm(args.dumped, args.cache)
    if args.cache:
        args.cache.chmod(0o700)
        os.environ["PCP_CACHE_DIR"] = str(args.cache.resolve())
    command = shlex.join(["python", "benchmarks/gpu_unequal.py", *sys.argv[1:]])
    results = []
    for name in args.runs:
        print(f"== {name}", flush=True)
        results.append(run_one(name, args.out / name, flags, args.timeout, args.cpu_cores))
        print(json.dumps(results[-1]), flush=True)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"{args.stem}.json").write_text(
        json.dumps({"command": command, "runs": results}, indent=1)
    )
    (args.results / f"{args.stem}.md").write_text(table(results, command))
    print(table(results, command))


if __name__ == "__main__":
    main(sys.argv[1:])
