"""bf16 matrix-product lowering configs for IREE CUDA, tried on the step's own dispatches.

IREE gives every bf16 product of the gpt-b32 step the same tile: 64x64 a workgroup, four
warps of 32x32, a 128-deep reduction tile (mma.sync 16x8x16). This tries other tiles on
the dispatches themselves, epilogues included, as IREE dumps them for benchmarking
(`iree-compile --iree-hal-dump-executable-benchmarks-to=DIR`, one module a dispatch).
`compile` (here, with the IREE compiler) rewrites each product dispatch's lowering
config once per candidate and compiles it; `run` (on an NVIDIA GPU machine with the
IREE runtime) times every module in one process and writes the table:

    python benchmarks/gpu_dispatch_configs.py compile --benchmarks DIR --out OUT
    python benchmarks/gpu_dispatch_configs.py run --out OUT --results FILE.md

A module's benchmark function runs its dispatch N times in one command buffer; the
figure is the median over repeats of the time per dispatch. Its operands then stay in
L2, so it flatters configs that hide memory latency badly: on the H100 two-warp tiles
won here and lost 3 ms in the step. Check winners on the whole step
(`kernel_profile.py` under Nsight Compute) before they go into the cuda plugin's
transform library (pcp_iree_cuda/kernel_configs.mlir).
"""

import argparse
import gc
import json
import re
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

# name: (workgroup tile M, N; mma tiles a warp along M, N; reduction tile in 16s)
CANDIDATES = {
    "64x64_w4_r8": (64, 64, 2, 4, 8),  # IREE's own choice
    "64x64_w4_r4": (64, 64, 2, 4, 4),
    "64x64_w4_r2": (64, 64, 2, 4, 2),
    "128x64_w2_r4": (128, 64, 4, 4, 4),
    "128x64_w8_r4": (128, 64, 2, 4, 4),
    "64x128_w4_r4": (64, 128, 2, 8, 4),
    "64x128_w8_r4": (64, 128, 2, 4, 4),
    "128x128_w8_r4": (128, 128, 4, 4, 4),
    "128x128_w8_r2": (128, 128, 4, 4, 2),
    "128x128_w4_r4": (128, 128, 4, 8, 4),
    "256x128_w8_r2": (256, 128, 4, 8, 2),
    "128x256_w8_r2": (128, 256, 4, 8, 2),
}
MMA_M, MMA_N = 16, 8  # NV_MMA_SYNC_F32_16x8x16_BF16


def configured(source: str, candidate: tuple[int, int, int, int, int]) -> str | None:
    """`source` with its product's tile replaced by `candidate`; None if it has no
    mma-configured product."""
    wg_m, wg_n, sub_m, sub_n, reduction = candidate
    found = re.search(r"workgroup = \[([\d, ]+)\]", source)
    if "mma_kind" not in source or not found:
        return None
    batch = len(found.group(1).split(",")) - 3  # leading batch dimensions, tiled by 1
    lead = "1, " * batch
    zeros = "0, " * batch
    warps = (wg_m // (MMA_M * sub_m)) * (wg_n // (MMA_N * sub_n))
    source = re.sub(r"workgroup = \[[\d, ]+\]", f"workgroup = [{lead}{wg_m}, {wg_n}, 0]", source)
    source = re.sub(r"subgroup = \[[\d, ]+\]", f"subgroup = [{zeros}{sub_m}, {sub_n}, 0]", source)
    source = re.sub(r"reduction = \[[\d, ]+\]", f"reduction = [{zeros}0, 0, {reduction}]", source)
    size = f"workgroup_size = [{warps * 32}, 1, 1]"
    return re.sub(r"workgroup_size = \[\d+, 1, 1\]", size, source)


def compile_all(benchmarks: Path, out: Path, target: str) -> None:
    from kernel_profile import matmul_flops  # the script beside this one

    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for path in sorted(benchmarks.glob("*_benchmark.mlir")):
        source = path.read_text()
        function = re.search(r"util\.func public @(\w+)\(%arg0: i32\)", source)
        if "matmul" not in source or function is None:
            continue
        for name, candidate in CANDIDATES.items():
            text = configured(source, candidate)
            if text is None:
                break
            stem = f"{path.stem.removesuffix('_cuda_nvptx_fb_benchmark')}__{name}"
            (out / f"{stem}.mlir").write_text(text)
            command = ["iree-compile", str(out / f"{stem}.mlir"), "--iree-hal-target-backends=cuda"]
            command += [f"--iree-cuda-target={target}", "-o", str(out / f"{stem}.vmfb")]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            error = "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[0]
            print(stem, "compiled" if not error else f"failed: {error[:160]}", flush=True)
            if not error:
                cases.append(
                    {
                        "stem": stem,
                        "config": name,
                        "function": function.group(1),
                        "flop": matmul_flops(function.group(1)),
                    }
                )
    (out / "cases.json").write_text(json.dumps(cases, indent=1))


def time_module(config: Any, path: Path, function: str, calls: int, repeats: int) -> float:
    """Median seconds a dispatch over `repeats` runs of `calls` dispatches each, on the
    device of `config` (an iree.runtime.Config)."""
    import iree.runtime as rt

    context = rt.SystemContext(config=config)
    context.add_vm_module(rt.VmModule.copy_buffer(context.instance, path.read_bytes()))
    run = context.modules.module[function]
    run(calls)  # load the executable, warm the clocks
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(calls)
        times.append((time.perf_counter() - started) / calls)
    del run, context  # the module's buffers (GBs: a slice of the whole step's) go now
    gc.collect()
    return statistics.median(times)


def run_all(out: Path, results: Path, calls: int, repeats: int) -> None:
    import iree.runtime as rt

    config = rt.Config("cuda")
    cases = json.loads((out / "cases.json").read_text())
    rows = []
    for case in cases:
        path = out / f"{case['stem']}.vmfb"
        try:
            seconds = time_module(config, path, case["function"], calls, repeats)
        except RuntimeError as error:  # a config the GPU cannot run (shared memory, ...)
            print(f"{case['stem']}: failed: {str(error).splitlines()[0][:200]}", flush=True)
            continue
        rows.append({**case, "us": seconds * 1e6, "tflops": case["flop"] / seconds / 1e12})
        print(f"{case['stem']}: {seconds * 1e6:.1f} us", flush=True)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    results.write_text(table(rows))


def table(rows: list[dict]) -> str:
    """One line a dispatch: IREE's default and the best candidate, then every candidate."""
    by_dispatch: dict[str, list[dict]] = {}
    for row in rows:
        by_dispatch.setdefault(row["function"], []).append(row)
    names = list(CANDIDATES)
    lines = ["| dispatch | " + " | ".join(names) + " | best |", "|---" * (len(names) + 2) + "|"]
    for function, found in by_dispatch.items():
        us = {r["config"]: r["us"] for r in found}
        best = min(found, key=lambda r: r["us"])
        cells = [f"{us[n]:.1f}" if n in us else "-" for n in names]
        short = re.sub(r"^main_dispatch_\d+_cuda_nvptx_fb_main_", "", function)
        winner = f"{best['config']} ({best['tflops']:.0f} TFLOP/s)"
        lines.append(f"| {short} | " + " | ".join(cells) + f" | {winner} |")
    return "Microseconds a dispatch.\n\n" + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["compile", "run"])
    parser.add_argument("--out", type=Path, required=True, help="folder for the modules")
    parser.add_argument("--benchmarks", type=Path, help="compile: IREE's dispatch benchmarks")
    parser.add_argument("--target", default="sm_80", help="compile: the CUDA architecture")
    parser.add_argument("--results", type=Path, default=Path("dispatch_configs.md"))
    parser.add_argument("--calls", type=int, default=50, help="run: dispatches a timed call")
    parser.add_argument("--repeats", type=int, default=7, help="run: timed calls a module")
    args = parser.parse_args()
    if args.command == "compile":
        if args.benchmarks is None:
            parser.error("compile needs --benchmarks")
        compile_all(args.benchmarks, args.out, args.target)
    else:
        run_all(args.out, args.results, args.calls, args.repeats)


if __name__ == "__main__":
    main()
