"""Peak memory and time of `pcp data prepare` on a corpus of about 1 GB.

Writes a deterministic text corpus (unless one is given): blocks of the built-in
village corpus, each with its own seed, alternating with blocks of made-up words drawn
from a vocabulary of 2 million by a Zipf law (a=1.07), which gives the long tail of
rare words that real text has and that a BPE trainer's memory grows with. It is
written a megabyte at a time, never held whole. Then, for each tokenizer, it runs
`pcp data prepare` in a child process, takes the child's peak resident memory from
`os.wait4` (the kernel's ru_maxrss of that process alone) and its wall time, and
checks every shard's sha256 against the manifest. Writes
benchmarks/results/prepare_memory.json and .md.

    python benchmarks/prepare_memory.py                       # 1 GiB, bytes and bpe
    python benchmarks/prepare_memory.py --tokenizers bytes    # only bytes
    python benchmarks/prepare_memory.py --corpus big.txt      # a corpus of your own
    python benchmarks/prepare_memory.py --size-mb 100 --keep  # smaller; keep the files
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pcp_core.data import corpus
from pcp_core.data.shards import PreparedDataset

RESULTS = Path(__file__).parent / "results"
MB = 10**6
LIMIT_BYTES = 10**9  # the budget: peak RSS under 1 GB


def made_up_words(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvwxz" for v in ("a", "e", "i", "o", "u", "ai")]
    lengths = rng.integers(1, 6, size=count)
    picks = rng.integers(0, len(syllables), size=(count, 5))
    return np.array(["".join(syllables[j] for j in picks[i, :n]) for i, n in enumerate(lengths)])


def write_corpus(path: Path, size_bytes: int) -> None:
    """About `size_bytes` of text, a megabyte-sized block at a time."""
    words = made_up_words(2_000_000, seed=1)
    written, block = 0, 0
    with open(path, "w", encoding="utf-8") as out:
        while written < size_bytes:
            if block % 2 == 0:
                text = corpus.generate(MB, seed=block)
            else:
                rng = np.random.default_rng(block)
                picks = np.minimum(rng.zipf(1.07, size=MB // 8), len(words)) - 1
                lines = [" ".join(words[picks[i : i + 12]]) for i in range(0, len(picks), 12)]
                text = ".\n".join(lines) + ".\n"
            out.write(text)
            written += len(text.encode("utf-8"))
            block += 1


# Measures one command from a small interpreter of its own: a child's ru_maxrss counts
# the memory of the process it was forked from, so forking the command from this (large)
# process would add this process's size to the figure.
MEASURE = """
import json, os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    json.dump({"code": os.waitstatus_to_exitcode(status), "maxrss_kb": usage.ru_maxrss}, out)
"""


def run_prepare(arguments: list[str]) -> dict:
    """Run `pcp ARGS` in a child; its wall time and peak resident memory."""
    command = [sys.executable, "-m", "pcp_core", *arguments]
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", MEASURE, report.name, *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wall = time.perf_counter() - started
        measured = json.loads(Path(report.name).read_text() or "{}")
    if done.returncode != 0 or measured.get("code") != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout}")
    return {"wall_s": round(wall, 1), "peak_rss_mb": round(measured["maxrss_kb"] * 1024 / MB, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="a text file to prepare (default: generate)")
    parser.add_argument("--size-mb", type=int, default=1074, help="generated corpus size (MB)")
    parser.add_argument("--tokenizers", default="bytes,bpe", help="comma-separated")
    parser.add_argument("--vocab-size", type=int, default=8192, help="for bpe")
    parser.add_argument("--workdir", type=Path, help="where the corpus and datasets go")
    parser.add_argument("--keep", action="store_true", help="leave the files in --workdir")
    args = parser.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pcp-prepare-"))
    workdir.mkdir(parents=True, exist_ok=True)
    source = args.corpus
    generate_s = None
    if source is None:
        source = workdir / "corpus.txt"
        if not source.exists():
            started = time.perf_counter()
            write_corpus(source, args.size_mb * MB)
            generate_s = round(time.perf_counter() - started, 1)
    size = source.stat().st_size
    print(f"corpus {source}: {size / MB:,.0f} MB", flush=True)

    baseline = run_prepare(["data", "prepare", "--help"])
    rows = []
    try:
        for tokenizer in args.tokenizers.split(","):
            output = workdir / f"data-{tokenizer}"
            extra = ["--vocab-size", str(args.vocab_size)] if tokenizer == "bpe" else []
            arguments = ["data", "prepare", str(source), "-o", str(output), "--overwrite"]
            figures = run_prepare([*arguments, "--tokenizer", tokenizer, *extra])
            dataset = PreparedDataset.open(output)
            started = time.perf_counter()
            dataset.verify()
            totals = dataset.manifest.totals
            row = {
                "tokenizer": tokenizer,
                "vocab_size": dataset.vocab_size,
                "dtype": dataset.manifest.dtype,
                "tokens": totals["tokens"],
                "shards": len(dataset.manifest.shards),
                **figures,
                "mb_per_s": round(size / MB / figures["wall_s"], 1),
                "verify_s": round(time.perf_counter() - started, 1),
                "hashes_match": True,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            if not args.keep:
                shutil.rmtree(output)
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    write_results(rows, size, baseline, generate_s)


def write_results(rows: list[dict], size: int, baseline: dict, generate_s: float | None) -> None:
    result = {
        "corpus_bytes": size,
        "generate_s": generate_s,
        "startup_peak_rss_mb": baseline["peak_rss_mb"],
        "limit_mb": LIMIT_BYTES / MB,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "runs": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "prepare_memory.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "| tokenizer | vocab | dtype | tokens | shards | wall s | MB/s | peak RSS MB | "
        "verify s | hashes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokenizer']} | {r['vocab_size']:,} | {r['dtype']} | {r['tokens']:,} | "
            f"{r['shards']} | {r['wall_s']} | {r['mb_per_s']} | {r['peak_rss_mb']} | "
            f"{r['verify_s']} | {'match' if r['hashes_match'] else 'MISMATCH'} |"
        )
    lines += [
        "",
        f"`pcp data prepare` on a {size / MB:,.0f} MB generated text corpus "
        f"({os.cpu_count()} CPU cores), default options (shards of 100M tokens, bpe trained "
        f"on the first 100 MB). Peak RSS is the command's own ru_maxrss (`os.wait4`); the "
        f"command's start-up alone (`pcp data prepare --help`) peaks at "
        f"{baseline['peak_rss_mb']} MB. The limit is {LIMIT_BYTES / MB:,.0f} MB.",
    ]
    (RESULTS / "prepare_memory.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
