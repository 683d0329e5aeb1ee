"""DiLoCo against a synchronous baseline on tinyshakespeare, same inner steps per worker.

The synchronous baseline averages every step (H = 1, outer lr 1, no momentum: plain
parameter averaging). DiLoCo runs at M = 2 and 4 workers with H = 10 and 50 and the
default outer Nesterov step. Each run is a real `pcp train --algorithm diloco` with
worker processes talking capnp-tcp on loopback. Writes benchmarks/results/diloco.json
and .md with validation loss and bytes sent for each.

    python benchmarks/diloco.py [--steps 500] [--data PATH]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
MODEL = [
    "--n-layer",
    "2",
    "--n-head",
    "4",
    "--n-embd",
    "64",
    "--block-size",
    "64",
    "--batch-size",
    "16",
]


def run(
    label: str, workers: int, inner_steps: int, steps: int, data: Path, outer: list[str]
) -> dict:
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable,
            "-m",
            "pcp_core",
            "train",
            "--algorithm",
            "diloco",
            "--backend",
            "cpu",
            "--workers",
            str(workers),
            "--inner-steps",
            str(inner_steps),
            "--steps",
            str(steps),
            "--data",
            str(data),
            "--eval-every",
            "0",
            "--eval-batches",
            "32",
            "--out",
            out,
            *MODEL,
            *outer,
        ]
        print(f"{label}: M={workers} H={inner_steps}", flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        summary = json.loads((Path(out) / "summary.json").read_text())
    return {
        "run": label,
        "workers": workers,
        "inner_steps": inner_steps,
        "steps_per_worker": steps,
        "rounds": summary["rounds"],
        "val_loss": round(summary["final_val_loss"], 4),
        "bytes_sent": summary["bytes_sent"],
        "bytes_received": summary["bytes_received"],
        "wall_time_s": round(summary["wall_time_s"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="inner steps per worker")
    parser.add_argument("--data", type=Path, default=SHAKESPEARE)
    args = parser.parse_args()
    if not args.data.is_file():
        sys.exit(f"skipped: {args.data} not found (pass --data PATH)")
    plain_averaging = ["--outer-lr", "1", "--outer-momentum", "0"]
    rows = []
    for workers in (2, 4):
        rows.append(run("synchronous", workers, 1, args.steps, args.data, plain_averaging))
        for inner_steps in (10, 50):
            rows.append(run("diloco", workers, inner_steps, args.steps, args.data, []))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "diloco.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        "| run | M | H | rounds | val loss | MB sent | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['run']} | {r['workers']} | {r['inner_steps']} | {r['rounds']} | "
        f"{r['val_loss']} | {r['bytes_sent'] / 1e6:.1f} | {r['wall_time_s']} |"
        for r in rows
    ]
    (RESULTS / "diloco.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
