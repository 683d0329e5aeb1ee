"""Float32 matrix-product lowering configs for IREE CUDA, one product at a time.

How the f32 configs in pcp_iree_cuda/kernel_configs.mlir were chosen. `compile` (here,
with the IREE compiler) writes each product of the gpt-b32 step's three layouts —
forward `[M,K]x[K,N]`, input gradient `[M,K]x[N,K]ᵀ`, weight gradient `[K,M]ᵀx[K,N]` —
once with IREE's default config and once per candidate config. `run` (on an NVIDIA GPU
machine with the IREE runtime) checks each against numpy in float64 on random inputs,
times it with iree-benchmark-module and writes the table:

    python benchmarks/gpu_matmul_configs.py compile --out mm
    python benchmarks/gpu_matmul_configs.py run --out mm \\
        --results benchmarks/results/gpu/h200/matmul_configs.md
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

# layout: (lhs map, rhs map, lhs shape, rhs shape) for M, N, K
LAYOUTS = {
    "nn": ("(d0, d2)", "(d2, d1)", lambda m, n, k: ((m, k), (k, n))),
    "nt": ("(d0, d2)", "(d1, d2)", lambda m, n, k: ((m, k), (n, k))),
    "tn": ("(d2, d0)", "(d2, d1)", lambda m, n, k: ((k, m), (k, n))),
}
PRODUCTS = {
    "forward": ("nn", 8192, 1536, 384),
    "input_grad": ("nt", 8192, 384, 1536),
    "weight_grad": ("tn", 384, 1536, 8192),
}
# (workgroup M, N; thread M, N; reduction tile; stage operands in shared memory)
CONFIGS = {
    "default": None,
    "128x64_8x8_r8": (128, 64, 8, 8, 8, False),
    "128x64_8x8_r8_shared": (128, 64, 8, 8, 8, True),
    "128x128_8x8_r16_shared": (128, 128, 8, 8, 16, True),
    "64x64_4x4_r16_shared": (64, 64, 4, 4, 16, True),
    "128x64_4x8_r16_shared": (128, 64, 4, 8, 16, True),
}


def compilation_info(wg_m: int, wg_n: int, t_m: int, t_n: int, red: int, shared: bool) -> str:
    threads = (wg_m // t_m) * (wg_n // t_n)
    promote = ", promote_operands = [0, 1]" if shared else ""
    lowering = (
        f"#iree_gpu.lowering_config<{{workgroup = [{wg_m}, {wg_n}, 0], "
        f"thread = [{t_m}, {t_n}, 0], reduction = [0, 0, {red}]{promote}}}>"
    )
    translation = (
        "#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<TileAndFuse> "
        f"workgroup_size = [{threads}, 1, 1] subgroup_size = 32>"
    )
    return (
        "compilation_info = #iree_codegen.compilation_info<"
        f"lowering_config = {lowering}, translation_info = {translation}>"
    )


def product_module(layout: str, m: int, n: int, k: int, attribute: str) -> str:
    lhs_map, rhs_map, shapes = LAYOUTS[layout]
    (a0, a1), (b0, b1) = shapes(m, n, k)
    attrs = f" attrs = {{{attribute}}}" if attribute else ""
    out = f"tensor<{m}x{n}xf32>"
    return f"""func.func @main(%a: tensor<{a0}x{a1}xf32>, %b: tensor<{b0}x{b1}xf32>) -> {out} {{
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : {out}
  %init = linalg.fill ins(%zero : f32) outs(%empty : {out}) -> {out}
  %r = linalg.generic {{indexing_maps = [affine_map<(d0, d1, d2) -> {lhs_map}>,
      affine_map<(d0, d1, d2) -> {rhs_map}>, affine_map<(d0, d1, d2) -> (d0, d1)>],
      iterator_types = ["parallel", "parallel", "reduction"]}}
      ins(%a, %b : tensor<{a0}x{a1}xf32>, tensor<{b0}x{b1}xf32>) outs(%init : {out}){attrs} {{
    ^bb0(%x: f32, %y: f32, %acc: f32):
      %p = arith.mulf %x, %y : f32
      %s = arith.addf %acc, %p : f32
      linalg.yield %s : f32
  }} -> {out}
  return %r : {out}
}}
"""


def compile_all(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for product, (layout, m, n, k) in PRODUCTS.items():
        for config, values in CONFIGS.items():
            name = f"{product}-{config}"
            source = out / f"{name}.mlir"
            source.write_text(
                product_module(layout, m, n, k, compilation_info(*values) if values else "")
            )
            command = ["iree-compile", str(source), "--iree-hal-target-backends=cuda"]
            command += ["--iree-cuda-target=sm_80", "-o", str(out / f"{name}.vmfb")]
            done = subprocess.run(command, capture_output=True, text=True)
            print(name, "compiled" if done.returncode == 0 else done.stderr.splitlines()[0])
            if done.returncode == 0:
                _, _, shapes = LAYOUTS[layout]
                lhs, rhs = shapes(m, n, k)
                cases.append(
                    {"name": name, "layout": layout, "mnk": [m, n, k], "lhs": lhs, "rhs": rhs}
                )
    (out / "cases.json").write_text(json.dumps(cases))


def median_ms(vmfb: Path, lhs: list[int], rhs: list[int]) -> float:
    splat = [f"--input={'x'.join(map(str, s))}xf32={v}" for s, v in ((lhs, 0.5), (rhs, 0.25))]
    command = [sys.executable, "-m", "iree._runtime.scripts.iree_benchmark_module"]
    command += ["--device=cuda", f"--module={vmfb}", "--function=main"]
    command += ["--benchmark_repetitions=7", *splat]
    text = subprocess.run(command, capture_output=True, text=True).stdout
    found = re.search(r"real_time_median\s+([\d.]+) ms", text)
    return float(found.group(1)) if found else float("nan")


def run_all(out: Path, results: Path) -> None:
    import iree.runtime as rt
    import numpy as np

    rng = np.random.default_rng(0)
    lines = ["| product | config | ms | TFLOP/s | rel. error vs float64 |", "|---|---|---|---|---|"]
    for case in json.loads((out / "cases.json").read_text()):
        a = rng.standard_normal(case["lhs"]).astype(np.float32)
        b = rng.standard_normal(case["rhs"]).astype(np.float32)
        context = rt.SystemContext(config=rt.Config("cuda"))
        vmfb = out / f"{case['name']}.vmfb"
        context.add_vm_module(rt.VmModule.copy_buffer(context.instance, vmfb.read_bytes()))
        got = np.asarray(context.modules.module.main(a, b))
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        a64 = a64.T if case["layout"] == "tn" else a64
        b64 = b64.T if case["layout"] == "nt" else b64
        expected = a64 @ b64
        error = float(np.linalg.norm(got - expected) / np.linalg.norm(expected))
        ms = median_ms(vmfb, case["lhs"], case["rhs"])
        m, n, k = case["mnk"]
        product, config = case["name"].split("-", 1)
        lines.append(
            f"| {product} {m}x{n}x{k} | {config} | {ms:.3f} | {2 * m * n * k / ms / 1e9:.1f} "
            f"| {error:.1e} |"
        )
        print(lines[-1], flush=True)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["compile", "run"])
    parser.add_argument("--out", type=Path, required=True, help="folder for the modules")
    parser.add_argument("--results", type=Path, default=Path("matmul_configs.md"))
    args = parser.parse_args()
    compile_all(args.out) if args.command == "compile" else run_all(args.out, args.results)


if __name__ == "__main__":
    main()
