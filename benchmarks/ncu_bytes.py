"""Where a step's DRAM bytes, L2 bytes and instructions go, from Nsight Compute.

On a power-capped GPU (an H200 at 700 W runs GPT-2 small at batch 16 and up at its cap)
a step's time follows the energy it spends, and moving bytes is much of that. This sums
`ncu`'s per-kernel counters for each way into a table by kind of kernel (products,
attention, the rest) and lists the kernels that move the most bytes.

Capture one CSV a way, on the GPU machine (`torch_anchor.py --ncu` brackets one call):
    ncu --clock-control none --profile-from-start off --csv --print-units base \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\\
lts__t_bytes.sum,sm__inst_executed.sum \\
        python3 benchmarks/torch_anchor.py --torch --xla pcp --ncu ... > pcp.csv
XLA's compile of PCP's step crashes under ncu: run the same command once without ncu
first, with the same PCP_CACHE_DIR, so the run under ncu loads the compiled step.
Then:
    python3 benchmarks/ncu_bytes.py pcp.csv torch.csv --steps 2 --results DIR
"""

import argparse
import collections
import csv
import json
from collections.abc import Callable
from pathlib import Path

METRICS = {
    "gpu__time_duration.sum": "ms",
    "dram__bytes_read.sum": "dram_read_gb",
    "dram__bytes_write.sum": "dram_write_gb",
    "lts__t_bytes.sum": "l2_gb",
    "sm__inst_executed.sum": "g_instructions",
}
SCALE = {
    "ms": 1e-6,
    "dram_read_gb": 1e-9,
    "dram_write_gb": 1e-9,
    "l2_gb": 1e-9,
    "g_instructions": 1e-9,
}
# Kernel names by kind: cuBLAS's (nvjet, cutlass, xmma), XLA's Triton products
# (gemm_fusion), cuDNN's and torch's attention.
PRODUCTS = ("nvjet", "gemm", "cutlass", "xmma", "splitkreduce")
ATTENTION = ("sdpa", "flash", "cudnn", "fmha", "attention")

Launch = dict[str, float | str]  # one kernel launch: its name, each metric in METRICS' units


def kind_of(kernel: str) -> str:
    """The kernel's kind by its name: "products", "attention" or "other"."""
    name = kernel.lower()
    if any(word in name for word in ATTENTION):
        return "attention"
    if any(word in name for word in PRODUCTS):
        return "products"
    return "other"


def read_kernels(path: Path) -> list[Launch]:
    """One dict a kernel launch: its name and each metric, in `METRICS`' units."""
    launches: dict[tuple[str, str], Launch] = {}
    with path.open() as handle:
        for row in csv.DictReader(line for line in handle if line.startswith('"')):
            metric = METRICS.get(row.get("Metric Name", ""))
            if metric is None:
                continue
            launch_id = (row["Process ID"], row["ID"])
            launch = launches.setdefault(launch_id, {"kernel": row["Kernel Name"]})
            value = row["Metric Value"].replace(",", "")
            try:
                launch[metric] = float(value) * SCALE[metric]
            except ValueError:  # "n/a": the counter was not collected for this launch
                continue
    if not launches:
        raise SystemExit(f"{path}: no rows with the metrics {', '.join(METRICS)}")
    return list(launches.values())


def per_step(
    launches: list[Launch], steps: int, groups: Callable[[Launch], tuple[str, ...]]
) -> dict[str, dict[str, float]]:
    """Launches and each metric a step, summed over the launches in each of the groups
    that `groups` puts a launch in."""
    sums: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for launch in launches:
        for group in groups(launch):
            sums[group]["launches"] += 1 / steps
            for metric in METRICS.values():
                sums[group][metric] += float(launch.get(metric, 0.0)) / steps
    return {group: {k: round(v, 4) for k, v in c.items()} for group, c in sums.items()}


def summary(launches: list[Launch], steps: int) -> dict[str, dict[str, float]]:
    """Each metric a step, for all kernels and by kind."""
    return per_step(launches, steps, lambda launch: ("all", kind_of(str(launch["kernel"]))))


def heaviest(launches: list[Launch], steps: int, rows: int) -> list[dict]:
    """The kernels (by name) that move the most DRAM bytes a step."""
    sums = per_step(launches, steps, lambda launch: (str(launch["kernel"]),))
    ranked = sorted(sums.items(), key=lambda kv: -(kv[1]["dram_read_gb"] + kv[1]["dram_write_gb"]))
    return [{"kernel": name, **metrics} for name, metrics in ranked[:rows]]


def table(ways: dict[str, dict[str, dict]]) -> str:
    """A markdown table of each way's `summary`, all kernels first, then by kind."""
    head = "| way | kind | launches | ms | DRAM read GB | DRAM write GB | L2 GB | G instr |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for way, kinds in ways.items():
        for kind in ("all", "products", "attention", "other"):
            s = kinds.get(kind)
            if s:
                lines.append(
                    f"| {way} | {kind} | {s['launches']:.0f} | {s['ms']:.2f} "
                    f"| {s['dram_read_gb']:.2f} | {s['dram_write_gb']:.2f} | {s['l2_gb']:.2f} "
                    f"| {s['g_instructions']:.2f} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv_files", nargs="+", type=Path, help="one ncu CSV a way")
    parser.add_argument("--steps", type=int, default=1, help="steps in each profiled call")
    parser.add_argument("--rows", type=int, default=25, help="heaviest kernels listed a way")
    parser.add_argument("--results", type=Path, default=None, help="write ncu_bytes.md/.json")
    args = parser.parse_args()
    ways, heavy = {}, {}
    for path in args.csv_files:
        launches = read_kernels(path)
        ways[path.stem] = summary(launches, args.steps)
        heavy[path.stem] = heaviest(launches, args.steps, args.rows)
    text = [f"Per step ({args.steps} steps profiled a way)", "", table(ways)]
    for way, kernels in heavy.items():
        text += ["", f"{way}: the kernels that move the most DRAM bytes a step", ""]
        text += ["| kernel | launches | ms | DRAM GB | GB/s |", "|---|---|---|---|---|"]
        for k in kernels:
            dram = k["dram_read_gb"] + k["dram_write_gb"]
            rate = dram / (k["ms"] / 1e3) if k["ms"] else 0.0
            text.append(
                f"| {k['kernel'][:90]} | {k['launches']:.0f} | {k['ms']:.3f} "
                f"| {dram:.3f} | {rate:.0f} |"
            )
    print("\n".join(text))
    if args.results:
        args.results.mkdir(parents=True, exist_ok=True)
        (args.results / "ncu_bytes.md").write_text("\n".join(text) + "\n")
        out = {"steps": args.steps, "ways": ways, "heaviest": heavy}
        (args.results / "ncu_bytes.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
