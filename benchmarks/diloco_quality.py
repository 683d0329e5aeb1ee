"""DiLoCo against synchronous training at equal tokens, on several corpora and model sizes.

For each corpus and model, the baseline is one process at batch B (every step sees
B sequences); DiLoCo runs M = 2 and 4 workers at batch B/M each for the same number
of steps (the same tokens per step, summed over the workers), with the defaults a user
gets (H and the outer momentum chosen by M: pcp_diloco.settings.DEFAULTS_BY_WORKERS).
Every run is a real `pcp train` on the CPU (DiLoCo with worker processes on capnp-tcp
over loopback); the final validation loss is measured on the same validation batches
for all runs. Every cell runs on several seeds (initialisation
and batches): at four workers one seed's ratio moves by 0.5-2.5 points from another's,
so the table gives each seed's ratio to the synchronous run of that seed, and their
mean. Writes benchmarks/results/diloco_quality.json and .md: each run's validation
loss, its ratio to the baseline's, the bytes sent, and the mean ratio of each cell.

    python benchmarks/diloco_quality.py                   # every corpus, both sizes, 3 seeds
    python benchmarks/diloco_quality.py --corpora shakespeare --models tiny --seeds 0
    python benchmarks/diloco_quality.py --variant old="--outer-lr 0.7 --outer-momentum 0.9"
    python benchmarks/diloco_quality.py --models tiny --workers 8 16     # many workers
    python benchmarks/diloco_quality.py --corpus mine=/elsewhere/text.txt --corpora mine
    python benchmarks/diloco_quality.py --no-defaults --variant f32="--codec f32 --codec-down f32" \
        --variant defaults="--algorithm sparseloco"      # SparseLoCo against float32 DiLoCo

Eight and sixteen workers run the tiny model only on 2 cores (`--workers 8 16 --models
tiny`: 17 processes a run, 30-50 s each). `--corpus NAME=PATH` adds a text of your own,
kept outside the project, to check defaults on a corpus they were not tuned on.

A `--variant NAME=FLAGS` adds DiLoCo runs with those flags on top of the defaults
(for ablations); the baseline ignores them. A variant's flags may name another algorithm
of M workers (`--variant defaults="--algorithm sparseloco"`, pip install pcp-sparseloco);
its rows are named after it. Every row has the bytes of a steady round on the wire, each
way, all workers together (the median of the rounds after the first, which sends the
whole model). The corpora:

- shakespeare: ../shared/data/tinyshakespeare.txt beside the checkout (skipped if absent);
- village: the built-in generated corpus;
- python: the first 1.2 MB of the Python standard library's top-level modules (code);
- perl-docs: the Perl documentation Debian installs, every .pod file under
  /usr/share/perl once (about 0.7 MB; skipped if absent). Each file is read once by its
  real path: /usr/share/perl/5.36 is a link to 5.36.0, and reading through both made
  an earlier version of this corpus perldiag.pod twice, its validation text a copy of
  training text.
"""

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from pcp_diloco.settings import rounds_for

RESULTS = Path(__file__).parent / "results"
SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
CORPUS_BYTES = 1_200_000
MODELS = {
    "tiny": [],  # the default model: 2 layers, 4 heads, 64 wide, 64-token context
    "small": ["--n-layer", "4", "--n-head", "4", "--n-embd", "96"],  # 64-token context too
}
BATCH = 32
WORKERS = (2, 4)


def assemble(files: list[Path], target: Path) -> Path | None:
    """The first CORPUS_BYTES of `files` concatenated, as UTF-8 text, or None if none."""
    if not files:
        return None
    text, size = [], 0
    for path in files:
        part = path.read_text(encoding="utf-8", errors="replace")
        text.append(part)
        size += len(part)
        if size >= CORPUS_BYTES:
            break
    target.write_text("".join(text)[:CORPUS_BYTES], encoding="utf-8")
    return target


def corpora(folder: Path) -> dict[str, Path | None]:
    """Each corpus's text file (None: the built-in corpus); absent ones are left out."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found: dict[str, Path | None] = {"village": None}
    if SHAKESPEARE.is_file():
        found["shakespeare"] = SHAKESPEARE
    else:
        print(f"shakespeare: skipped, {SHAKESPEARE} not found", file=sys.stderr)
    python = assemble(sorted(stdlib.glob("*.py")), folder / "python.txt")
    if python:
        found["python"] = python
    pods = sorted({path.resolve() for path in Path("/usr/share/perl").glob("*/**/*.pod")})
    perl = assemble(pods, folder / "perl-docs.txt")
    if perl:
        found["perl-docs"] = perl
    else:
        print("perl-docs: skipped, no .pod file under /usr/share/perl", file=sys.stderr)
    return found


def extra_corpora(items: list[str], builtin: dict[str, Path | None]) -> dict[str, Path | None]:
    """The corpora of --corpus NAME=PATH, each checked to be a file under a name of its
    own (one that shadowed a built-in corpus would mix two texts in one table)."""
    found: dict[str, Path | None] = {}
    for item in items:
        name, _, path = item.partition("=")
        if not name or not Path(path).is_file():
            sys.exit(f"--corpus {item!r}: expected NAME=PATH of a text file")
        if name in builtin or name in found:
            sys.exit(f"--corpus {item!r}: {name!r} names another corpus already")
        found[name] = Path(path)
    return found


def train(
    data: Path | None, model: list[str], steps: int, flags: list[str], backend: str = "cpu"
) -> dict:
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable, "-m", "pcp_core", "train", "--backend", backend, "--no-dashboard",
            "--steps", str(steps), "--eval-every", "0", "--eval-batches", "64",
            "--out", str(Path(out) / "run"), *(["--data", str(data)] if data else []),
            *model, *flags,
        ]  # fmt: skip
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"failed: {shlex.join(command)}\n{done.stderr[-3000:]}")
        summary = json.loads((Path(out) / "run" / "summary.json").read_text())
        records = (Path(out) / "run" / "metrics.jsonl").read_text().splitlines()
    steady = [r for r in map(json.loads, records) if r.get("round", 0) > 0]  # not the first
    return {
        "val_loss": round(summary["final_val_loss"], 4),
        "bytes_sent": summary.get("bytes_sent", 0),
        # a steady round's bytes on the wire each way, all workers together (median)
        "round_bytes_sent": median_of(steady, "bytes_sent"),
        "round_bytes_received": median_of(steady, "bytes_received"),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def median_of(records: list[dict], key: str) -> float:
    values = [record[key] for record in records if key in record]
    return statistics.median(values) if values else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps of every run")
    parser.add_argument(
        "--backend",
        default="cpu",
        help="backend of every run (e.g. xla: jax's CPU or GPU, for machines without IREE)",
    )
    parser.add_argument("--corpora", nargs="+", help="a subset of the corpora")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument(
        "--small-corpora",
        nargs="+",
        default=["shakespeare"],
        help="corpora the small model runs on (it costs ~4x the tiny one)",
    )
    parser.add_argument("--variant", action="append", default=[], help="NAME=FLAGS")
    parser.add_argument(
        "--no-defaults",
        action="store_true",
        help="only the --variant runs, not DiLoCo with its defaults",
    )
    parser.add_argument(
        "--workers", type=int, nargs="+", default=list(WORKERS), help="the M of the DiLoCo runs"
    )
    parser.add_argument(
        "--corpus",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a corpus of your own (a text file, kept outside the project), run after the "
        "built-in ones; with --corpora, name it there too",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0, 1, 2],
        help="seeds each cell runs with (initialisation and batches)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "diloco_quality")
    args = parser.parse_args()
    variants: dict[str, list[str]] = {} if args.no_defaults else {"defaults": []}
    for item in args.variant:
        name, _, flags = item.partition("=")
        variants[name] = shlex.split(flags)

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        builtin = corpora(Path(folder))
        found = builtin | extra_corpora(args.corpus, builtin)
        for corpus, data in found.items():
            if args.corpora and corpus not in args.corpora:
                continue
            for model in args.models:
                if model != "tiny" and corpus not in args.small_corpora:
                    continue
                for seed in args.seeds:
                    run_cell(rows, args, corpus, data, model, seed, variants)


def run_cell(
    rows: list[dict],
    args: argparse.Namespace,
    corpus: str,
    data: Path | None,
    model: str,
    seed: int,
    variants: dict[str, list[str]],
) -> None:
    """The synchronous run and every DiLoCo run of one corpus, model and seed."""
    shape, seeded = MODELS[model], ["--seed", str(seed)]
    cell = {"corpus": corpus, "model": model, "seed": seed}
    baseline = train(data, shape, args.steps, ["--batch-size", str(BATCH), *seeded], args.backend)
    rows.append({**cell, "run": "synchronous", "workers": 1, **baseline, "ratio": 1.0})
    write(rows, args)
    for name, flags in variants.items():
        for workers in args.workers:
            diloco = [
                "--algorithm", "diloco", "--workers", str(workers),
                "--batch-size", str(BATCH // workers), *seeded, *flags,
            ]  # fmt: skip
            result = train(data, shape, args.steps, diloco, args.backend)
            ratio = round(result["val_loss"] / baseline["val_loss"], 4)
            rows.append({**cell, "run": f"{algorithm_of(flags)} {name}", "workers": workers,
                         **result, "ratio": ratio})  # fmt: skip
            write(rows, args)


def algorithm_of(flags: list[str]) -> str:
    """The algorithm a variant's flags run: the last `--algorithm` among them, else DiLoCo."""
    named = [flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag == "--algorithm"]
    return named[-1] if named else "diloco"


def mean_ratios(rows: list[dict]) -> list[dict]:
    """Per corpus, model, run and M: each seed's ratio and their mean."""
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["run"] != "synchronous":
            key = (row["corpus"], row["model"], row["run"], row["workers"])
            cells.setdefault(key, []).append(row)
    return [
        {
            "corpus": corpus,
            "model": model,
            "run": run,
            "workers": workers,
            "ratios": {r["seed"]: r["ratio"] for r in runs},
            "mean_ratio": round(sum(r["ratio"] for r in runs) / len(runs), 4),
        }
        for (corpus, model, run, workers), runs in cells.items()
    ]


def write(rows: list[dict], args: argparse.Namespace) -> None:
    """The table so far (rewritten after every run, so a stopped benchmark keeps its
    rows), and the last row on stdout."""
    print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = mean_ratios(rows)
    inner_steps = {m: rounds_for(m, args.steps) for m in args.workers}  # the defaults' H
    record = {"steps": args.steps, "batch": BATCH, "inner_steps": inner_steps,
              "backend": args.backend, "seeds": args.seeds, "mean_ratios": summary,
              "rows": rows}  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    seeds = ", ".join(str(seed) for seed in args.seeds)
    lines = [
        f"{args.steps} steps, {BATCH} sequences a step in all (DiLoCo: {BATCH}/M a worker), "
        f"the defaults' H = {', '.join(f'{h} at M = {m}' for m, h in inner_steps.items())}, "
        f"seeds {seeds}, backend {args.backend}; validation loss on 64 batches. Each DiLoCo run "
        "against the synchronous run of its seed:",
        "",
        f"| corpus | model | run | M | {' | '.join(f'seed {s}' for s in args.seeds)} | mean |",
        f"|---|---|---|---|{'---|' * len(args.seeds)}---|",
    ]
    for cell in summary:
        ratios = [cell["ratios"].get(seed) for seed in args.seeds]
        shown = " | ".join("" if r is None else f"{(r - 1) * 100:+.1f}%" for r in ratios)
        lines.append(
            f"| {cell['corpus']} | {cell['model']} | {cell['run']} | {cell['workers']} | "
            f"{shown} | **{(cell['mean_ratio'] - 1) * 100:+.1f}%** |"
        )
    lines += [
        "",
        "Every run:",
        "",
        "| corpus | model | seed | run | M | val loss | vs synchronous | MB sent | "
        "KB a round, out / back | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['corpus']} | {r['model']} | {r['seed']} | {r['run']} | {r['workers']} | "
        f"{r['val_loss']} | {(r['ratio'] - 1) * 100:+.1f}% | {r['bytes_sent'] / 1e6:.1f} | "
        f"{r.get('round_bytes_sent', 0) / 1e3:.1f} / "
        f"{r.get('round_bytes_received', 0) / 1e3:.1f} | "
        f"{r['wall_s']} |"
        for r in rows
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
