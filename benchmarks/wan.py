"""Rehearse DiLoCo over emulated WAN links and report what each scenario costs.

For each scenario file, the shepherd and every worker run as real `pcp shepherd` /
`pcp worker` processes, each in its own network namespace behind the scenario's link
(rate, delay, jitter, loss: docs/wan.md), through pcp_core.rehearsal.harness. Per
scenario and variant (blocking rounds, overlapped ones, streaming fragments) and seed
it reports the wall time, the rounds, bytes per round and in the busiest round, the
round time split (round_s, compute_s of the slowest worker, communication_s), compute
utilisation and the final validation loss, and writes them to
benchmarks/results/wan/<name>.json and .md with the exact command. Needs root (network
namespaces).

    sudo .venv/bin/python benchmarks/wan.py --scenario scenarios/lan.toml scenarios/thin.toml
    sudo .venv/bin/python benchmarks/wan.py --scenario scenarios/mixed-planet.toml \\
        --max-workers 4 --steps 100 --inner-steps 20 --variants blocking stream4 --seeds 0 1

Flags after `--` go to `pcp shepherd` as they are.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "wan"

# Each variant's shepherd flags: DiLoCo's overlap and streaming fragments (docs/wan.md).
VARIANTS = {
    "as-given": (),  # only the flags after `--`
    "blocking": ("--overlap", "none", "--fragments", "1"),
    "overlapped": ("--overlap", "delayed", "--fragments", "1"),
    **{f"stream{p}": ("--overlap", "delayed", "--fragments", str(p)) for p in (2, 4, 8, 16)},
    # rounds by time for unequal workers (--round-budget auto, merged by tokens)
    "budgeted": ("--overlap", "none", "--fragments", "1", "--round-budget", "auto"),
    "budgeted-overlapped": ("--overlap", "delayed", "--fragments", "1", "--round-budget", "auto"),
    # each Delta right after its Result (a round trip less); results sent ahead of their
    # Assignment, two rounds in flight (--overlap ahead, which pushes deltas)
    "blocking-pushed": ("--overlap", "none", "--fragments", "1", "--deltas", "pushed"),
    "ahead": ("--overlap", "ahead", "--fragments", "1"),
    "budgeted-pushed": (
        *("--overlap", "none", "--fragments", "1", "--round-budget", "auto"),
        *("--deltas", "pushed"),
    ),
    "budgeted-ahead": ("--overlap", "ahead", "--fragments", "1", "--round-budget", "auto"),
    **{f"ahead-stream{p}": ("--overlap", "ahead", "--fragments", str(p)) for p in (2, 4)},
    **{
        f"budgeted-ahead-stream{p}": (
            *("--overlap", "ahead", "--fragments", str(p), "--round-budget", "auto"),
        )
        for p in (2, 4)
    },
}


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The benchmark's own flags, and the shepherd flags given after `--`."""
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Flags after `--` are passed to `pcp shepherd` unchanged (e.g. -- --batch-size 8).",
    )
    parser.add_argument(
        "--scenario", nargs="+", required=True, type=Path, help="scenario TOML file(s)"
    )
    parser.add_argument("--steps", type=int, default=60, help="inner steps per worker in all")
    parser.add_argument("--inner-steps", type=int, default=20, help="inner steps per round (H)")
    parser.add_argument("--steps-per-call", type=int, default=10, help="steps per device call")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0], help="one run per seed (default: 0)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["as-given"],
        choices=sorted(VARIANTS),
        help="rounds to compare, each run on every scenario and seed: blocking, overlapped "
        "(--overlap delayed), streamP (overlapped with P fragments), budgeted (--round-budget "
        "auto), ahead (--overlap ahead), ...-pushed (--deltas pushed); as-given (default): "
        "only the flags after `--`",
    )
    parser.add_argument("--n-layer", type=int, default=1, help="model size (tiny by default)")
    parser.add_argument("--n-head", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument(
        "--max-workers",
        type=int,
        default=None,
        help="run at most N of a scenario's workers, picked evenly across its list so "
        "each kind of link keeps a share (on a small machine 8 CPU workers are slow)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per scenario")
    parser.add_argument(
        "--name", default=None, help="results file stem (default: the scenarios' names)"
    )
    parser.add_argument(
        "--runs", type=Path, default=None, help="where run directories go (default: runs/wan-*)"
    )
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="results folder (default: %(default)s)"
    )
    return parser.parse_args(argv), extra


def pick_workers(workers: list[Any], limit: int | None) -> list[Any]:
    """At most `limit` workers, spread evenly over the list (first and last kept)."""
    if limit is None or limit >= len(workers):
        return workers
    if limit <= 1:
        return workers[:1]
    step = (len(workers) - 1) / (limit - 1)
    return [workers[round(i * step)] for i in range(limit)]


def utilisation(summary: dict[str, Any], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Compute utilisation: the shepherd's own figure where it gives one, and ours.

    Ours is Σ worker compute / Σ (workers × round_s) over the round records, from each
    worker's `worker_compute_s` when the records have it, else from `compute_s` (the
    slowest worker's) for every worker, which overstates it.
    """
    busy = sum(
        sum(r["worker_compute_s"].values())
        if "worker_compute_s" in r
        else r["workers"] * r["compute_s"]
        for r in rounds
    )
    span = sum(r["workers"] * r["round_s"] for r in rounds)
    source = "worker_compute_s" if all("worker_compute_s" in r for r in rounds) else "compute_s"
    return {
        "shepherd": summary.get("compute_utilisation"),
        "from_rounds": round(busy / span, 4) if span else None,
        "from_rounds_source": source,
    }


def describe(result: Any, scenario: Any, workers: int) -> dict[str, Any]:
    """The numbers reported for one scenario's run."""
    summary, rounds = result.summary, result.rounds
    per_round = [r.get("bytes_sent", 0) + r.get("bytes_received", 0) for r in rounds]
    # the first round sends every worker the whole model whatever the variant
    steady = per_round[1:] or per_round

    def mean(key: str) -> float | None:
        values = [r[key] for r in rounds if key in r]
        return round(sum(values) / len(values), 4) if values else None

    val_loss = summary.get("final_val_loss")
    if val_loss is None:
        val_loss = next((r["val_loss"] for r in reversed(rounds) if "val_loss" in r), None)
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "workers": workers,
        "exit_codes": result.exit_codes,
        "wall_s": round(result.wall_s, 2),
        "training_wall_s": summary.get("wall_time_s"),
        "rounds": len(rounds),
        "min_workers_in_a_round": min((r["workers"] for r in rounds), default=0),
        "bytes_per_round": round(sum(per_round) / len(per_round)) if per_round else None,
        "peak_round_bytes": max(steady, default=None),
        "model_bytes": summary.get("model_bytes"),
        "round_s": mean("round_s"),
        "compute_s": mean("compute_s"),
        "communication_s": mean("communication_s"),
        "utilisation": utilisation(summary, rounds),
        "worker_utilisation": summary.get("worker_utilisation"),
        "tokens": summary.get("tokens"),
        "shepherd_link": result.shepherd_link,
        "final_val_loss": val_loss,
        "final_train_loss": summary.get("final_train_loss"),
        "run_dir": str(result.run_dir),
    }


def progress(metrics: Path, label: str) -> Any:
    """A `during` callback that prints each new round record of the run."""
    seen = [0]

    def report(network: Any, elapsed: float) -> None:
        if not metrics.exists():
            return
        lines = [line for line in metrics.read_text().splitlines() if '"round_s"' in line]
        for line in lines[seen[0] :]:
            r = json.loads(line)
            print(
                f"  [{label} {elapsed:6.1f}s] round {r['round']}: {r['workers']} workers, "
                f"loss {r['loss']:.3f}, round {r['round_s']:.2f}s "
                f"(compute {r['compute_s']:.2f}s, communication {r['communication_s']:.2f}s)",
                flush=True,
            )
        seen[0] = len(lines)

    return report


def fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def megabytes(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.3f}"


def combined(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per scenario and variant: means over its seeds, and the validation loss
    against the blocking variant's on the same seeds (where both ran)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["scenario"], row["variant"]), []).append(row)

    def mean(values: list[Any]) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    lines = []
    for (scenario, variant), runs in groups.items():
        blocking = {r["seed"]: r for r in groups.get((scenario, "blocking"), [])}
        pairs = [(r, blocking.get(r["seed"])) for r in runs]
        gaps = [
            r["final_val_loss"] / b["final_val_loss"] - 1
            for r, b in pairs
            if b is not None and r["final_val_loss"] and b["final_val_loss"]
        ]
        lines.append(
            {
                "scenario": scenario,
                "variant": variant,
                "seeds": [r["seed"] for r in runs],
                "utilisation": mean([r["utilisation"]["shepherd"] for r in runs]),
                "min_utilisation": min(
                    (r["utilisation"]["shepherd"] for r in runs if r["utilisation"]["shepherd"]),
                    default=None,
                ),
                "training_wall_s": mean([r["training_wall_s"] for r in runs]),
                "bytes_per_round": mean([r["bytes_per_round"] for r in runs]),
                "peak_round_bytes": max((r["peak_round_bytes"] or 0 for r in runs), default=None),
                "val_losses": [r["final_val_loss"] for r in runs],
                "loss_vs_blocking": mean(gaps) if gaps else None,
                "worst_loss_vs_blocking": max(gaps) if gaps else None,
            }
        )
    return lines


def markdown(command: str, settings: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The results as a markdown page: command, machine, settings, a line per scenario
    and variant (means over the seeds), then every run."""
    lines = [
        "# DiLoCo over emulated WAN links (benchmarks/wan.py)",
        "",
        f"```\n{command}\n```",
        "",
        f"{datetime.datetime.now().isoformat(timespec='seconds')}, {platform.node()}, "
        f"{os.cpu_count()} CPUs, Linux {platform.release()}. Settings: "
        + ", ".join(f"{k} {v}" for k, v in settings.items()),
        "",
        "| scenario | rounds | seeds | compute utilisation (mean, min) | training s "
        "| MB / round | MB in the busiest round | val loss | vs blocking (mean, worst) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for line in combined(rows):
        gap, worst = line["loss_vs_blocking"], line["worst_loss_vs_blocking"]
        losses = " / ".join(fmt(v, 4) for v in line["val_losses"])
        lines.append(
            f"| {line['scenario']} | {line['variant']} | {' '.join(map(str, line['seeds']))} "
            f"| {fmt(line['utilisation'])}, {fmt(line['min_utilisation'])} "
            f"| {fmt(line['training_wall_s'], 1)} | {megabytes(line['bytes_per_round'])} "
            f"| {megabytes(line['peak_round_bytes'])} | {losses} "
            + (
                "| - |"
                if gap is None or line["variant"] == "blocking"
                else f"| {gap:+.2%}, {worst:+.2%} |"
            )
        )
    lines += [
        "",
        "Every run:",
        "",
        "| scenario | rounds | seed | workers | rounds | wall s | training s | round s "
        "| compute s | communication s | bytes / round | busiest round | utilisation "
        "(shepherd / ours) | val loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        u = row["utilisation"]
        lines.append(
            f"| {row['scenario']} | {row['variant']} | {row['seed']} | {row['workers']} "
            f"| {row['rounds']} | {fmt(row['wall_s'], 1)} | {fmt(row['training_wall_s'], 1)} "
            f"| {fmt(row['round_s'])} | {fmt(row['compute_s'])} | {fmt(row['communication_s'])} "
            f"| {fmt(row['bytes_per_round'])} | {fmt(row['peak_round_bytes'])} "
            f"| {fmt(u['shepherd'])} / {fmt(u['from_rounds'])} | {fmt(row['final_val_loss'], 4)} |"
        )
    lines += [
        "",
        "rounds: blocking (a worker waits for the new global parameters), overlapped "
        "(`--overlap delayed`), streamP (overlapped, `--fragments P`), as-given (the flags "
        "after `--` alone). wall s: from building the network to the shepherd's exit "
        "(worker start-up, join and compile included); training s: the shepherd's "
        "wall_time_s. round s, compute s (the slowest worker's inner steps) and "
        "communication s (the rest of the round) are means over the round records. bytes / "
        "round: sent + received by the shepherd, the mean over rounds; busiest round: the "
        "most any round after the first moved (the first sends every worker the whole model "
        "in every variant): the peak that the links must carry at once. Utilisation: the "
        "shepherd's `compute_utilisation` (summary.json), and ours, Σ worker compute / "
        "Σ (workers × round_s) over the rounds (from each worker's `worker_compute_s`; "
        "from the slowest worker's `compute_s` where the records lack it). vs blocking: the "
        "validation loss against the blocking run's of the same scenario and seed.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run every scenario, variant and seed in turn; write the JSON and markdown results."""
    args, extra = parse_args(argv)
    from pcp_core.rehearsal.harness import RehearsalError, TrainingSettings, run_scenario
    from pcp_core.rehearsal.links import requirements_problem
    from pcp_core.rehearsal.scenario import load_scenario

    problem = requirements_problem()
    if problem:
        print(f"wan.py: {problem}", file=sys.stderr)
        return 2
    scenarios = [load_scenario(path) for path in args.scenario]  # all checked before any runs
    model = ["--n-layer", str(args.n_layer), "--n-head", str(args.n_head)]
    model += ["--n-embd", str(args.n_embd), "--block-size", str(args.block_size)]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs = args.runs or ROOT / "runs" / f"wan-{stamp}"
    rows = []
    for scenario in scenarios:
        workers = pick_workers(list(scenario.workers), args.max_workers)
        scenario = dataclasses.replace(scenario, workers=workers)
        for variant in args.variants:
            for seed in args.seeds:
                settings = TrainingSettings(
                    steps=args.steps,
                    inner_steps=args.inner_steps,
                    seed=seed,
                    shepherd_flags=(
                        *model,
                        *("--steps-per-call", str(args.steps_per_call)),
                        *VARIANTS[variant],
                        *extra,
                    ),
                )
                label = f"{scenario.name}/{variant}/seed{seed}"
                run_dir = runs / scenario.name / variant / f"seed{seed}"
                print(f"{label}: {len(scenario.workers)} workers, run in {run_dir}", flush=True)
                try:
                    result = run_scenario(
                        scenario,
                        run_dir,
                        settings,
                        timeout_s=args.timeout,
                        during=progress(run_dir / "shepherd" / "metrics.jsonl", label),
                    )
                except RehearsalError as error:
                    print(f"{label}: failed: {error}", file=sys.stderr)
                    rows.append({"scenario": scenario.name, "variant": variant, "seed": seed,
                                 "error": str(error), "run_dir": str(run_dir)})  # fmt: skip
                    continue
                row = describe(result, scenario, len(scenario.workers))
                row |= {"variant": variant, "seed": seed}
                rows.append(row)
                print(f"{label}: {json.dumps(row)}", flush=True)

    command = shlex.join([Path(sys.executable).name, "benchmarks/wan.py", *argv])
    described = {
        "steps": args.steps,
        "inner_steps": args.inner_steps,
        "model": " ".join(model),
        "max_workers": args.max_workers,
        "shepherd_flags": " ".join(extra) or None,
    }
    name = args.name or "-".join(s.name for s in scenarios)
    args.results.mkdir(parents=True, exist_ok=True)
    good = [row for row in rows if "error" not in row]
    data = {"command": command, "settings": described, "combined": combined(good), "runs": rows}
    (args.results / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (args.results / f"{name}.md").write_text(markdown(command, described, good))
    print(f"wrote {args.results / name}.json and .md")
    return 0 if len(good) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
