"""Several GPUs in one machine (issue 35): one `xla` worker on two GPUs against one GPU,
and one worker per GPU.

Each run is a real `pcp train --algorithm diloco` (shepherd and local workers), one after
another, while `nvidia-smi` samples every GPU twice a second:

    one-gpu          one xla worker on GPU 0, batch B
    one-gpu-global   one xla worker on GPU 0, batch 2B (the two-GPU worker's global batch)
    two-gpu-worker   one xla worker on GPUs 0 and 1 (--devices-per-worker 2), batch 2B
    two-workers      two xla workers, one per GPU, batch B each (DiLoCo between them)
    iree-workers     two IREE cuda workers, one per GPU, batch B each

Every run trains the same tokens: --steps S at 2B, or S per worker at B. For each run it
reports tokens/s over the training phase, tokens/s of compute alone (each worker's tokens
over its compute seconds, rounds after the first, summed over workers), bytes a round,
the final validation loss, and each GPU's mean utilisation and peak memory while the run
trained; then the ratios the issue judges: the two-GPU worker against one GPU (at the
same batch per GPU, and at the same global batch) and its loss against one-gpu-global.
Writes <results>/<stem>.json and .md with the command.

A machine without the IREE compiler serves iree-workers from PCP's compile cache, as
`benchmarks/gpu_unequal.py` explains: `dump` there, `prewarm` where the compiler is,
`run --cache CACHE` there.

    python benchmarks/multi_gpu.py run --batch 16 --runs one-gpu two-gpu-worker -- FLAGS
    python benchmarks/multi_gpu.py dump --batch 16 --out DUMP -- FLAGS
    python benchmarks/multi_gpu.py report A.json B.json --stem both   # runs made apart

FLAGS (after `--`) go to every `pcp train` as they are: model, data, steps, H.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_unequal import DUMP_SHEPHERD

# run -> (worker backends, devices a worker, batch in units of B)
RUNS = {
    "one-gpu": ("xla", 1, 1),
    "one-gpu-global": ("xla", 1, 2),
    "two-gpu-worker": ("xla", 2, 2),
    "two-workers": ("xla,xla", 1, 1),
    "iree-workers": ("cuda,cuda", 1, 1),
}
# NVLink multicast stays off in every process (the GPU machines' rule), whatever the
# environment the benchmark was started with
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def train_argv(run: str, batch: int, run_dir: Path, flags: list[str]) -> list[str]:
    backends, devices, units = RUNS[run]
    return [
        *("train", "--algorithm", "diloco", "--backend", "xla"),
        *("--worker-backends", backends, "--devices-per-worker", str(devices)),
        *("--batch-size", str(batch * units), "--out", str(run_dir)),
        *("--no-dashboard", "--overwrite", *flags),
    ]


def sample_gpus(path: Path) -> subprocess.Popen | None:
    """nvidia-smi writing each GPU's utilisation and memory to `path` twice a second;
    None where there is no nvidia-smi (a trial on the CPU)."""
    query = "timestamp,index,utilization.gpu,memory.used"
    argv = ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-lms", "500"]
    path.touch()
    if shutil.which("nvidia-smi") is None:
        return None
    with path.open("w") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL)


def run_one(run: str, batch: int, out: Path, flags: list[str], timeout_s: float) -> dict:
    run_dir = out / run
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **NO_MULTICAST, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    argv = [sys.executable, "-m", "pcp_core", *train_argv(run, batch, run_dir, flags)]
    sampler = sample_gpus(out / f"{run}-gpus.csv")
    try:
        with (out / f"{run}.log").open("wb") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        apps = watch(process, run_dir / "metrics.jsonl", timeout_s)
    finally:
        if sampler is not None:
            sampler.send_signal(signal.SIGTERM)
            sampler.wait()
    if process.returncode != 0:
        tail = (out / f"{run}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{run}: pcp train exited {process.returncode}\n{tail}")
    return {
        **measure(run, run_dir),
        "gpus": gpu_use(out / f"{run}-gpus.csv"),
        "processes_on_gpus": apps,
        "command": shlex.join(["pcp", *train_argv(run, batch, run_dir, flags)]),
    }


def watch(process: subprocess.Popen, metrics: Path, timeout_s: float) -> str:
    """Wait for `pcp train` to end; in its second round, ask nvidia-smi which processes
    hold memory on which GPU (the evidence that a run used both)."""
    started, apps = time.monotonic(), ""
    while process.poll() is None:
        if time.monotonic() - started > timeout_s:
            process.kill()
            process.wait()
            raise RuntimeError(f"pcp train ran past {timeout_s:.0f} s")
        if not apps and metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            query = ["--query-compute-apps=pid,gpu_bus_id,used_memory", "--format=csv"]
            if shutil.which("nvidia-smi"):
                apps = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True).stdout
            else:
                apps = "no nvidia-smi"
        time.sleep(0.5)
    return apps


def measure(run: str, run_dir: Path) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    cumulative = [0, *(r["tokens"] for r in records)]
    for record, before, after in zip(records, cumulative, cumulative[1:], strict=False):
        record["round_tokens"] = after - before
    steady = records[1:] or records  # the first round warms up
    compute_rate = 0.0  # tokens a second of compute, summed over workers
    for worker in steady[0]["worker_steps"]:
        tokens = compute = 0.0
        for record in steady:
            per_step = record["round_tokens"] / sum(record["worker_steps"].values())
            tokens += record["worker_steps"][worker] * per_step
            compute += record["worker_compute_s"][worker]
        compute_rate += tokens / compute
    steady_tokens = sum(r["round_tokens"] for r in steady)
    return {
        "run": run,
        "rounds": len(records),
        "tokens": summary["tokens"],
        "training_s": summary["training_s"],
        "tokens_per_s": round(summary["tokens"] / summary["training_s"], 1),
        "steady_tokens_per_s": round(steady_tokens / sum(r["cycle_s"] for r in steady), 1),
        "compute_tokens_per_s": round(compute_rate, 1),
        "bytes_per_round": round(summary["bytes_sent"] / len(records)),
        "bytes_received_per_round": round(summary["bytes_received"] / len(records)),
        "final_val_loss": round(summary["final_val_loss"], 5),
        "val_losses": [r["val_loss"] for r in records if "val_loss" in r],
        "worker_utilisation": summary["worker_utilisation"],
    }


def gpu_use(samples: Path) -> dict[str, dict[str, float]]:
    """Each GPU's mean utilisation over the samples taken while it computed (busy above
    zero) and the share of the run's samples it was busy in, and its peak memory."""
    by_gpu: dict[str, list[tuple[float, float]]] = {}
    with samples.open() as rows:
        for row in csv.reader(rows):
            if len(row) == 4 and row[2].strip().isdigit():
                by_gpu.setdefault(row[1].strip(), []).append((float(row[2]), float(row[3])))
    return {
        gpu: {
            "busy_share": round(sum(u > 0 for u, _ in seen) / len(seen), 3),
            "mean_busy_util": round(statistics.fmean([u for u, _ in seen if u > 0] or [0]), 1),
            "peak_memory_mib": max(m for _, m in seen),
        }
        for gpu, seen in sorted(by_gpu.items())
    }


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """What the issue judges, from the runs that were made."""
    out = {}
    pairs = {
        "two_gpu_vs_one_gpu_same_batch_per_gpu": ("two-gpu-worker", "one-gpu"),
        "two_gpu_vs_one_gpu_same_global_batch": ("two-gpu-worker", "one-gpu-global"),
        "two_workers_vs_one_gpu": ("two-workers", "one-gpu"),
        "iree_workers_vs_one_gpu": ("iree-workers", "one-gpu"),
    }
    for name, (run, base) in pairs.items():
        if run in results and base in results:
            for rate in ("compute_tokens_per_s", "steady_tokens_per_s", "tokens_per_s"):
                out[f"{name}_{rate}"] = round(results[run][rate] / results[base][rate], 3)
    for run in ("two-gpu-worker", "two-workers", "iree-workers"):
        if run in results and "one-gpu-global" in results:
            loss, base = results[run]["final_val_loss"], results["one-gpu-global"]["final_val_loss"]
            out[f"{run}_val_loss_vs_one_gpu_global"] = round(loss / base - 1, 4)
    return out


def table(results: dict[str, dict[str, Any]], command: str) -> str:
    lines = [
        f"`{command}`",
        "",
        "| run | tokens | training s | tokens/s | steady tokens/s | compute tokens/s | "
        "MB sent a round | final val loss | GPU busy share, mean util |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results.values():
        gpus = "; ".join(
            f"{gpu}: {use['busy_share']:.0%}, {use['mean_busy_util']:.0f}%"
            for gpu, use in r["gpus"].items()
        )
        lines.append(
            f"| {r['run']} | {r['tokens']:,} | {r['training_s']:.1f} | {r['tokens_per_s']:,.0f} "
            f"| {r['steady_tokens_per_s']:,.0f} | {r['compute_tokens_per_s']:,.0f} "
            f"| {r['bytes_per_round'] / 1e6:.1f} | {r['final_val_loss']:.4f} | {gpus} |"
        )
    lines += ["", *(f"- {k}: {v}" for k, v in ratios(results).items()), ""]
    return "\n".join(lines)


def dump(batch: int, out: Path, flags: list[str], timeout_s: float) -> None:
    """Run iree-workers until the shepherd would compile; keep the program it would."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-c", DUMP_SHEPHERD, str(out / "program")]
    argv += train_argv("iree-workers", batch, out / "run", flags)
    env = {**os.environ, **NO_MULTICAST, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    with (out / "dump.log").open("wb") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    started = time.monotonic()
    try:
        while not (out / "program" / "program.json").exists():
            if time.monotonic() - started > timeout_s or process.poll() is not None:
                raise SystemExit(f"no program dumped; see {out}/dump.log")
            time.sleep(1)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    print(f"{out}/program: {(out / 'program' / 'program.json').read_text()}")


def main(argv: list[str]) -> None:
    flags: list[str] = []
    if "--" in argv:
        argv, flags = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["run", "dump", "report"])
    parser.add_argument("reports", nargs="*", type=Path, help="report: results of runs")
    parser.add_argument("--batch", type=int, default=16, help="B: sequences a GPU a step")
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS)[:4])
    parser.add_argument("--cache", type=Path, help="PCP's compile cache (for iree-workers)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/multi_gpu"))
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results/gpu"))
    parser.add_argument("--stem", default="multi_gpu")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take")
    args = parser.parse_args(argv)
    if args.command == "dump":
        return dump(args.batch, args.out, flags, args.timeout)
    if args.command == "report":
        return report(args.reports, args.results, args.stem)
    if args.cache:
        args.cache.chmod(0o700)
        os.environ["PCP_CACHE_DIR"] = str(args.cache.resolve())
    command = shlex.join(["python", "benchmarks/multi_gpu.py", *sys.argv[1:]])
    results: dict[str, dict[str, Any]] = {}
    args.results.mkdir(parents=True, exist_ok=True)
    for run in args.runs:
        print(f"== {run}", flush=True)
        try:
            results[run] = run_one(run, args.batch, args.out, flags, args.timeout)
        except RuntimeError as error:
            print(f"{run} failed: {error}", flush=True)
            continue
        print(json.dumps(results[run]), flush=True)
        write(results, command, args.results, args.stem)
    print(table(results, command))


def write(results: dict[str, dict[str, Any]], command: str, where: Path, stem: str) -> None:
    report = {"command": command, "runs": results, "ratios": ratios(results)}
    (where / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (where / f"{stem}.md").write_text(table(results, command))


def report(paths: list[Path], where: Path, stem: str) -> None:
    """One table of runs that were made by separate commands (each its own results)."""
    results, commands = {}, []
    for path in paths:
        made = json.loads(path.read_text())
        results.update(made["runs"])
        commands.append(made["command"])
    where.mkdir(parents=True, exist_ok=True)
    write(results, "`; `".join(commands), where, stem)
    print(table(results, "`; `".join(commands)))


if __name__ == "__main__":
    main(sys.argv[1:])
