"""What spot checks cost (`--spot-check`, pcp_core.shepherd.spot_checks): one-command
DiLoCo runs of M local CPU workers, the same seed and data, without checks and with a
fraction of the results re-run on the shepherd. Per run: the wall time, the mean round,
the mean seconds a round spent in checks (the ratio is of rounds: the first run also
fills the compile cache), the checks made, and a check's time against
a worker's round of compute (the same work, on the shepherd's core). All runs use one
machine, so shepherd and workers share its cores: a shepherd of its own pays only the
checks' compute, not the workers' contention.

Writes benchmarks/results/spot_checks.json and .md.

    python benchmarks/spot_checks.py [--workers 4] [--fractions 0 0.25 1]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
MODEL = ["--n-layer", "2", "--n-head", "4", "--n-embd", "128", "--block-size", "64"]


def one_run(folder: Path, workers: int, fraction: float, rounds: int, inner_steps: int) -> dict:
    out = folder / f"spot-{fraction}"
    command = [sys.executable, "-m", "pcp_core", "train", "--algorithm", "diloco"]
    command += ["--backend", "cpu", "--workers", str(workers), "--seed", "0"]
    command += ["--steps", str(rounds * inner_steps), "--inner-steps", str(inner_steps)]
    command += ["--eval-every", "0", "--spot-check", str(fraction), "--out", str(out), *MODEL]
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall_s = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    checks = sum(r["spot_checks"] for r in records)
    check_s = sum(r["spot_check_s"] for r in records)
    compute_s = statistics.mean(r["compute_s"] for r in records)
    return {
        "fraction": fraction,
        "wall_s": round(wall_s, 2),
        "round_s": round(statistics.mean(r["round_s"] for r in records), 4),
        "spot_check_s_per_round": round(check_s / len(records), 4),
        "checks": checks,
        "failures": (summary["spot_checks"] or {}).get("failures", 0),
        "check_s": round(check_s / checks, 4) if checks else None,
        "worker_compute_s": round(compute_s, 4),
        "final_val_loss": summary["final_val_loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.25, 1.0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--inner-steps", type=int, default=20)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rows = [
            one_run(Path(folder), args.workers, f, args.rounds, args.inner_steps)
            for f in args.fractions
        ]
    base = rows[0]
    for row in rows:  # a round's time, not the wall's: the first run also fills the compile cache
        row["round_ratio"] = round(row["round_s"] / base["round_s"], 3)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "spot_checks.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        f"# Spot checks' cost: {args.workers} CPU workers, {args.rounds} rounds of "
        f"{args.inner_steps} steps, one machine",
        "",
        f"`python benchmarks/spot_checks.py --workers {args.workers} --fractions "
        f"{' '.join(map(str, args.fractions))}`",
        "",
        "| --spot-check | checks | failed | round s (× none) | checks s a round "
        "| one check s | a worker's round compute s | val loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['fraction']} | {r['checks']} | {r['failures']} | {r['round_s']} "
            f"({r['round_ratio']}×) | {r['spot_check_s_per_round']} "
            f"| {r['check_s']} | {r['worker_compute_s']} | {r['final_val_loss']:.4f} |"
        )
    (args.results / "spot_checks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
