"""Fault tolerance in numbers: how fast a killed worker is back, and what the shepherd
costs per round and in memory as the number of workers grows.

- rejoin: a one-command DiLoCo run with two workers; one worker is killed (SIGKILL)
  `--kills` times, `--gap` seconds apart; the time from the kill to the shepherd's
  next "worker joined" line is the kill-to-rejoin time (supervisor backoff, process
  start, handshake, program and data). The default gap is over the supervisor's
  STABLE_S, so each kill is a first crash (1 s backoff), not one of a loop.
- load: the same run with 4, 8 and 16 local workers; per round, the shepherd's overhead
  is the round's time minus the slowest worker's compute time (sending parameters,
  checking and fetching results, the outer step), and its peak RSS comes from the run
  summary. The model is small enough for 16 workers on a small machine, big enough that
  the shepherd's nine copies' worth of it show.

Writes benchmarks/results/faults.json and .md.

    python benchmarks/faults.py
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pcp_core.worker.supervisor import STABLE_S

RESULTS = Path(__file__).parent / "results"
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "64", "--block-size", "32"]
LOAD_MODEL = ["--n-layer", "2", "--n-head", "4", "--n-embd", "256", "--block-size", "32"]


def pcp(*args: str, stderr: Path) -> subprocess.Popen[bytes]:
    with stderr.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "pcp_core", *args], stdout=subprocess.DEVNULL, stderr=err
        )


def worker_pids(run_dir: Path) -> list[int]:
    """The local worker processes of a run (their command lines name its directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if f"--state-dir {run_dir}/worker-1" in cmdline:
            pids.append(int(entry.name))
    return pids


def wait_until(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("gave up waiting")
        time.sleep(0.02)


def rejoin_times(folder: Path, kills: int, gap_s: float) -> list[float]:
    out = folder / "rejoin"
    log = folder / "rejoin.err"
    run = pcp(
        *("train", "--algorithm", "diloco", "--backend", "cpu", "--workers", "2"),
        *("--steps", "100000", "--inner-steps", "10", "--eval-every", "0", "--out", str(out)),
        *TINY,
        stderr=log,
    )
    try:
        joined = lambda: log.read_text().count("worker joined")  # noqa: E731
        wait_until(lambda: joined() >= 2 and (out / "metrics.jsonl").exists(), 300)
        times = []
        for _ in range(kills):
            before = joined()
            wait_until(lambda: worker_pids(out), 60)
            os.kill(worker_pids(out)[0], signal.SIGKILL)
            killed = time.perf_counter()
            wait_until(lambda before=before: joined() > before, 120)
            times.append(time.perf_counter() - killed)
            time.sleep(gap_s)
        return times
    finally:
        run.send_signal(signal.SIGINT)
        run.wait(60)


def load_row(folder: Path, workers: int) -> dict:
    out = folder / f"load-{workers}"
    run = pcp(
        *("train", "--algorithm", "diloco", "--backend", "cpu", "--workers", str(workers)),
        *("--steps", "12", "--inner-steps", "2", "--steps-per-call", "2", "--batch-size", "2"),
        *("--eval-every", "0", "--out", str(out), *LOAD_MODEL),
        stderr=folder / f"load-{workers}.err",
    )
    if run.wait(1800) != 0:
        raise RuntimeError((folder / f"load-{workers}.err").read_text()[-3000:])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    overheads = [r["round_s"] - r["compute_s"] for r in records[1:]]  # round 0 warms up
    return {
        "workers": workers,
        "rounds": len(records),
        "all_took_part": all(r["workers"] == workers for r in records),
        "round_overhead_ms": round(1e3 * statistics.median(overheads), 1),
        "round_ms": round(1e3 * statistics.median(r["round_s"] for r in records[1:]), 1),
        "model_mib": round(summary["model_bytes"] / 2**20, 2),
        "shepherd_peak_rss_mib": round(summary["shepherd_peak_rss_bytes"] / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--gap", type=float, default=STABLE_S + 5, help="seconds between kills")
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8, 16])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        times = rejoin_times(folder, args.kills, args.gap)
        rows = [load_row(folder, n) for n in args.workers]
    results = {
        "command": "python benchmarks/faults.py " + " ".join(sys.argv[1:]),
        "cpus": os.cpu_count(),
        "kill_to_rejoin_s": [round(t, 2) for t in times],
        "kill_to_rejoin_median_s": round(statistics.median(times), 2),
        "load": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "faults.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        f"Command: `{results['command']}` on {results['cpus']} CPUs.",
        "",
        f"Kill-to-rejoin (SIGKILL of a worker to the shepherd's next `worker joined`): "
        f"median {results['kill_to_rejoin_median_s']} s over {len(times)} kills "
        f"({', '.join(str(t) for t in results['kill_to_rejoin_s'])} s).",
        "",
        "| workers | rounds | all took part | round (ms) | shepherd overhead (ms) | "
        "model (MiB) | shepherd peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['workers']} | {r['rounds']} | {r['all_took_part']} | {r['round_ms']} | "
            f"{r['round_overhead_ms']} | {r['model_mib']} | {r['shepherd_peak_rss_mib']} |"
            for r in rows
        ),
    ]
    (RESULTS / "faults.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
