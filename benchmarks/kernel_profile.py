"""Where an IREE GPU train step spends its time, kernel by kernel (Nsight Compute).

`run` executes one train step (K=1) of a step_time.py size through PCP's executor, with
real parameters and data; run it under ncu. `table` sums ncu's CSV by kernel and writes
the top kernels with their share of the step and, for matrix products, their FLOP/s
(2·∏dims from the kernel name, which IREE spells `matmul_MxNxK` or
`matmul_like_BxMxNxK`). On an NVIDIA GPU machine, with modules from
`step_time.py --compile-only`:

    JAX_PLATFORMS=cpu ncu --clock-control none --metrics gpu__time_duration.sum --csv \\
        --print-units base --log-file kernels.csv \\
        python benchmarks/kernel_profile.py run --vmfb-dir vmfb --size gpt-b32 --precision bf16
    python benchmarks/kernel_profile.py table kernels.csv --out benchmarks/results/gpu/X.md
"""

import argparse
import collections
import csv
import json
import math
import re
from pathlib import Path

MATMUL = re.compile(r"_(?:batch_)?matmul(?:_like)?_((?:\d+x)+\d+)_")


def run(args: argparse.Namespace) -> None:
    import step_time

    from pcp_core import plugins
    from pcp_core.data import text as data
    from pcp_core.iree.executor import IreeExecutor
    from pcp_core.program import nanogpt

    backend = plugins.host().backend(args.backend)
    corpus = data.load_text_file(None)
    config, program = step_time.build(step_time.SIZES[args.size], corpus, args.precision, 1)
    path = step_time.module_path(args.vmfb_dir, args.size, args.precision, backend, 1)
    specs = program.param_specs, program.opt_specs
    flags = backend.runtime.runtime_flags
    executor = IreeExecutor(path.read_bytes(), backend.runtime.driver, *specs, runtime_flags=flags)
    params = list(nanogpt.init(config, 0).values())
    executor.set_params(params)
    executor.set_opt_state(program.init_opt_state(params))
    x, y = corpus.batches("train", 1, program.batch_size, program.block_size, (0, 0))
    print("loss", float(executor.run(x, y)[0]))


def matmul_flops(kernel: str) -> int | None:
    found = MATMUL.search(kernel + "_")
    return 2 * math.prod(int(d) for d in found.group(1).split("x")) if found else None


def table(args: argparse.Namespace) -> None:
    with open(args.csv_file) as handle:
        rows = csv.DictReader(line for line in handle if line.startswith('"'))
        total_ns, launches = collections.Counter(), collections.Counter()
        for row in rows:
            if row.get("Metric Name") == "gpu__time_duration.sum":
                name = row["Kernel Name"]
                total_ns[name] += float(row["Metric Value"].replace(",", ""))
                launches[name] += 1
    if not total_ns:
        raise SystemExit(f"{args.csv_file}: no gpu__time_duration.sum rows (did ncu run?)")
    step_ns = sum(total_ns.values())
    kernels = []
    for name, ns in total_ns.most_common():
        flops = matmul_flops(name)
        kernels.append(
            {
                "kernel": name,
                "launches": launches[name],
                "ms": ns / 1e6,
                "share": ns / step_ns,
                "tflops": flops * launches[name] / ns / 1e3 if flops else None,
            }
        )
    matmul_ns = sum(k["ms"] for k in kernels if k["tflops"] is not None) * 1e6
    lines = [
        f"{sum(launches.values())} launches of {len(kernels)} kernels, "
        f"{step_ns / 1e6:.1f} ms of GPU time; matrix products {100 * matmul_ns / step_ns:.0f}%\n",
        "| kernel | launches | ms | share | TFLOP/s |",
        "|---|---|---|---|---|",
    ]
    for k in kernels[: args.top]:
        rate = f"{k['tflops']:.1f}" if k["tflops"] is not None else ""
        lines.append(
            f"| `{k['kernel']}` | {k['launches']} | {k['ms']:.2f} | {100 * k['share']:.1f}% "
            f"| {rate} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(kernels, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run", help="one K=1 step through the executor")
    runner.add_argument("--backend", default="cuda")
    runner.add_argument("--vmfb-dir", type=Path, required=True)
    runner.add_argument("--size", default="gpt-b32")
    runner.add_argument("--precision", default="f32")
    summary = commands.add_parser("table", help="sum an ncu CSV by kernel")
    summary.add_argument("csv_file", type=Path)
    summary.add_argument("--top", type=int, default=20)
    summary.add_argument("--out", type=Path, help="markdown table (and .json beside it)")
    args = parser.parse_args()
    run(args) if args.command == "run" else table(args)


if __name__ == "__main__":
    main()
