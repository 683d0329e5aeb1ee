"""How long each aggregator takes to merge a round of GPT-2 small's pseudo-gradients, beside
the time the results take to arrive on a 1 Gbit/s link.

For M workers (default 8 and 32) it makes M pseudo-gradients of GPT-2 small's shapes
(124M parameters: a shared direction plus a different part each), then times, side by
side on the same arrays, each aggregator's `combine` as the shepherd calls it, and the
mean as the shepherd really runs it (summed into float64 as each result arrives,
`RunningSum`), plus the cosine scores the shepherd computes for every held result. The
link time is M results of the default codec's size (fp4, measured by encoding one) and
of float32 through one 1 Gbit/s link into the shepherd. Holding 32 results of GPT-2
small takes 16 GB: the machine needs that much free memory.

    python benchmarks/aggregation_time.py                  # M = 8 and 32, every aggregator
    python benchmarks/aggregation_time.py --workers 8 --aggregators mean centered-clip

Results: benchmarks/results/aggregation_time.{json,md}.
"""

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pcp_core import plugins
from pcp_core.codecs import encode_tensor
from pcp_core.shepherd.accountability import cosines
from pcp_core.shepherd.aggregation import RunningSum

RESULTS = Path(__file__).parent / "results"
LINK_BITS_PER_S = 1e9
# GPT-2 small: 12 layers, width 768, 1024 positions, 50257 tokens, tied embeddings
WIDTH, LAYERS, VOCAB, BLOCK = 768, 12, 50257, 1024
LAYER_SHAPES = [
    (WIDTH,), (WIDTH,), (WIDTH, 3 * WIDTH), (3 * WIDTH,), (WIDTH, WIDTH), (WIDTH,),
    (WIDTH,), (WIDTH,), (WIDTH, 4 * WIDTH), (4 * WIDTH,), (4 * WIDTH, WIDTH), (WIDTH,),
]  # fmt: skip
SHAPES = [(VOCAB, WIDTH), (BLOCK, WIDTH), *LAYER_SHAPES * LAYERS, (WIDTH,), (WIDTH,)]


def pseudo_gradients(count: int) -> list[list[np.ndarray]]:
    """`count` results near one direction: the direction, plus a shifted copy of it."""
    rng = np.random.default_rng(0)
    base = [rng.standard_normal(shape, dtype=np.float32) * 1e-3 for shape in SHAPES]
    results = []
    for worker in range(count):
        shift = 7919 * (worker + 1)
        results.append([b + 0.5 * np.roll(b.reshape(-1), shift).reshape(b.shape) for b in base])
    return results


def timed(function: Callable[[], object]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--aggregators", nargs="+", default=None, help="default: every one")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    host = plugins.host()
    names = args.aggregators or host.registries["aggregator"].names()
    parameters = sum(int(np.prod(shape)) for shape in SHAPES)
    fp4 = host.codec("fp4")
    sample = pseudo_gradients(1)[0]
    fp4_bytes = sum(len(encode_tensor(fp4, array)) for array in sample)
    rows = []
    for count in args.workers:
        results = pseudo_gradients(count)
        out = [np.empty(shape, np.float32) for shape in SHAPES]
        row = {
            "workers": count,
            "parameters": parameters,
            "link_fp4_s": count * fp4_bytes * 8 / LINK_BITS_PER_S,
            "link_f32_s": count * parameters * 4 * 8 / LINK_BITS_PER_S,
            # the shepherd's cosine scores: each result against a merge (here the first result)
            "cosine_scores_s": timed(lambda results=results: cosines(results, results[0])),
        }
        sums = [np.zeros(shape, np.float64) for shape in SHAPES]

        def streamed(results=results, sums=sums, out=out) -> None:
            total = RunningSum(sums)
            for result in results:
                total.add(result)
            total.mean_into(out)

        row["mean (streamed)_s"] = timed(streamed)
        del sums
        for name in names:
            combiner = host.aggregator(name).create()
            weights = [1] * count
            row[f"{name}_s"] = timed(
                lambda c=combiner, r=results, w=weights, o=out: c.combine(0, r, w, o)
            )
            print(json.dumps({"workers": count, name: round(row[f"{name}_s"], 2)}), flush=True)
        rows.append({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
        del results
    write(args.results, rows, fp4_bytes)


def write(results: Path, rows: list[dict], fp4_bytes: int) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / "aggregation_time.json").write_text(json.dumps(rows, indent=1))
    keys = [k for k in rows[0] if k.endswith("_s") and not k.startswith("link")]
    lines = [
        "# Aggregation time, GPT-2 small's pseudo-gradients (124M parameters), "
        f"{os.cpu_count()} cores",
        "",
        "`python benchmarks/aggregation_time.py " + " ".join(sys.argv[1:]) + "`",
        "",
        f"One fp4 result is {fp4_bytes / 1e6:.1f} MB, a float32 one "
        f"{rows[0]['parameters'] * 4 / 1e6:.0f} MB. Seconds:",
        "",
        "| M | arrive on 1 Gbit/s, fp4 | float32 | " + " | ".join(k[:-2] for k in keys) + " |",
        "|---|---|---|" + "---|" * len(keys),
    ]
    for row in rows:
        cells = " | ".join(f"{row[k]:.2f}" for k in keys)
        lines.append(
            f"| {row['workers']} | {row['link_fp4_s']:.1f} | {row['link_f32_s']:.1f} | {cells} |"
        )
    (results / "aggregation_time.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
