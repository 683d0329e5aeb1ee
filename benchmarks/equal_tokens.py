"""Equal-speed DiLoCo at the tokens of each rehearsed run: the reference for rounds by time.

A run with `--round-budget` trains as many tokens as its workers' speeds allow, so its
validation loss compares with DiLoCo on workers of equal speed that trained the same
tokens. For each run of a `benchmarks/wan.py` results file, this trains that reference
for real (`pcp train --algorithm diloco` on the CPU, the run's workers, model, batch,
H, steps per call and seed, over loopback: with every worker running H steps a round,
speed changes nothing but time) at the two whole numbers of rounds around the run's
tokens, and interpolates their final validation losses linearly in tokens. Writes
<results>/<name>.json and .md: each run's tokens, every worker's compute utilisation,
its validation loss, the reference's at its tokens, and their ratio.

    python benchmarks/equal_tokens.py benchmarks/results/wan/unequal-3w-h96.json \\
        --variants budgeted-overlapped budgeted
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

# What the reference takes over from the run's config.toml, as `pcp train` flags: the
# model, batch and seed, and the codecs (a run's own, not today's defaults).
COPIED = (
    "n_layer",
    "n_head",
    "n_embd",
    "block_size",
    "batch_size",
    "steps_per_call",
    "seed",
    "codec",
    "codec_down",
)


def run_config(run_dir: Path) -> dict[str, Any]:
    """The rehearsed shepherd's settings, flattened (top level and [diloco])."""
    config = tomllib.loads((run_dir / "shepherd" / "config.toml").read_text())
    flat = {k: v for k, v in config.items() if not isinstance(v, dict)}
    flat |= config.get("diloco", {}) | config.get("shepherd", {})
    return flat


TRAINED: dict[tuple[Any, ...], float] = {}  # references already trained, by their flags


def reference_loss(config: dict[str, Any], workers: int, rounds: int, folder: Path) -> float:
    """The final validation loss of equal-speed DiLoCo for `rounds` rounds of H steps
    (trained once for the runs that share it: variants of one seed)."""
    key = (workers, rounds, config["inner_steps"], *(config.get(k) for k in COPIED))
    if key not in TRAINED:
        TRAINED[key] = train_reference(config, workers, rounds, folder)
    return TRAINED[key]


def train_reference(config: dict[str, Any], workers: int, rounds: int, folder: Path) -> float:
    steps = rounds * config["inner_steps"]
    flags = [f"--{key.replace('_', '-')}={config[key]}" for key in COPIED if key in config]
    command = [
        *(sys.executable, "-m", "pcp_core", "train", "--algorithm", "diloco"),
        *("--backend", "cpu", "--workers", str(workers), "--steps", str(steps)),
        *("--inner-steps", str(config["inner_steps"]), "--eval-every", "0"),
        *(*flags, "--out", str(folder / f"r{rounds}")),
    ]
    print("  " + shlex.join(command[2:]), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the reference run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads((folder / f"r{rounds}" / "summary.json").read_text())
    return float(summary["final_val_loss"])


def at_equal_tokens(row: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The reference loss at the run's tokens, from the two round counts around them."""
    config = run_config(Path(row["run_dir"]))
    workers = row["workers"]
    per_round = workers * config["inner_steps"] * config["batch_size"] * config["block_size"]
    fewer = max(math.floor(row["tokens"] / per_round), 1)
    losses = {r: reference_loss(config, workers, r, folder) for r in (fewer, fewer + 1)}
    share = row["tokens"] / per_round - fewer
    reference = losses[fewer] + share * (losses[fewer + 1] - losses[fewer])
    return {
        "reference_rounds": {str(r): round(v, 4) for r, v in losses.items()},
        "reference_val_loss": round(reference, 4),
        "ratio": round(row["final_val_loss"] / reference, 4),
    }


def markdown(command: str, rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Rounds by time against equal-speed DiLoCo at equal tokens",
        "",
        f"`{command}`",
        "",
        "| variant | seed | tokens | worker utilisation | val loss "
        "| equal-speed at its tokens | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        shares = "/".join(f"{100 * v:.1f}" for v in row["worker_utilisation"].values())
        lines.append(
            f"| {row['variant']} | {row['seed']} | {row['tokens']:,} | {shares}% | "
            f"{row['final_val_loss']:.4f} | {row['reference_val_loss']:.4f} | "
            f"{100 * (row['ratio'] - 1):+.2f}% |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("wan_results", type=Path, help="a benchmarks/wan.py results .json")
    parser.add_argument("--variants", nargs="+", default=None, help="only these variants")
    parser.add_argument("--name", default=None, help="results stem (default: <input>-equal-tokens)")
    args = parser.parse_args(argv)
    try:
        runs = json.loads(args.wan_results.read_text())["runs"]
    except (OSError, ValueError, KeyError) as error:
        parser.error(f"{args.wan_results}: not a wan.py results file ({error})")
    wanted = set(args.variants or {r["variant"] for r in runs})
    chosen = [r for r in runs if "error" not in r and r["variant"] in wanted]
    if not chosen:
        parser.error(f"no finished runs of {args.variants or 'any variant'} in {args.wan_results}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pcp-equal-tokens-") as scratch:
        for row in chosen:
            print(f"{row['variant']}/seed{row['seed']}: {row['tokens']:,} tokens", flush=True)
            folder = Path(scratch) / f"{row['variant']}-{row['seed']}"
            rows.append(row | at_equal_tokens(row, folder))
            print(f"  ratio {rows[-1]['ratio']}", flush=True)
    command = shlex.join([Path(sys.executable).name, "benchmarks/equal_tokens.py", *argv])
    name = args.name or f"{args.wan_results.stem}-equal-tokens"
    out = args.wan_results.parent
    (out / f"{name}.json").write_text(
        json.dumps({"command": command, "runs": rows}, indent=2) + "\n"
    )
    (out / f"{name}.md").write_text(markdown(command, rows))
    print(f"wrote {out / name}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
