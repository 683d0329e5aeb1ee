"""IREE modules of one train step timed side by side, each in its own process.

Variants of a step (modules compiled from different programs or with different flags,
by `step_time.py --compile-only` into one folder each) and runtime flags are compared
in one call on one machine, since timings differ between machines and leases. Each
(module, runtime flags) pair runs in a fresh process (IREE parses runtime flags once a
process) through PCP's executor, with real parameters and data as step_time.py feeds
them; the figure is the median time per step over the timed calls. The final loss and
the parameters' relative difference from the first variant show that the variants
compute the same step.

    python benchmarks/module_time.py --size gpt-b32 --precision bf16 \\
        --module base=vmfb_base --module new=vmfb_new \\
        --flags default= --flags async=--cuda_async_allocations=true

A `--flags` value is NAME=FLAG[,FLAG...]; `NAME=` alone means the backend's own runtime
flags. Writes a Markdown table to stdout and, with --out, JSON beside it.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    import step_time

    from pcp_core import plugins
    from pcp_core.data import text as data
    from pcp_core.iree.executor import IreeExecutor
    from pcp_core.program import nanogpt

    backend = plugins.host().backend(args.backend)
    size = step_time.SIZES[args.size]
    corpus = data.load_text_file(None)
    k = size["steps_per_call"]
    # the tensors' names, shapes and optimizer state do not depend on K: a one-step
    # program says them as well, and traces in a fraction of the time
    config, program = step_time.build(size, corpus, args.precision, 1)
    path = step_time.module_path(Path(args.vmfb_dir), args.size, args.precision, backend, k)
    flags = (
        tuple(args.runtime_flags.split(","))
        if args.runtime_flags
        else backend.runtime.runtime_flags
    )
    started = time.perf_counter()
    executor = IreeExecutor(
        path.read_bytes(), backend.runtime.driver, program.param_specs, program.opt_specs,
        runtime_flags=flags,
    )  # fmt: skip
    params = list(nanogpt.init(config, 0).values())
    executor.set_params(params)
    executor.set_opt_state(program.init_opt_state(params))
    load_s = time.perf_counter() - started
    times, loss = [], None
    for call in range(args.calls + 1):  # call 0 warms up
        x, y = corpus.batches("train", k, size["batch_size"], config["block_size"], (0, call))
        started = time.perf_counter()
        loss = executor.run(x, y)
        if call:
            times.append((time.perf_counter() - started) / k * 1e3)
    np.savez(args.params_out, *executor.params())
    print(
        "RESULT "
        + json.dumps(
            {
                "ms_per_step": round(statistics.median(times), 2),
                "min_ms": round(min(times), 2),
                "max_ms": round(max(times), 2),
                "load_s": round(load_s, 1),
                "final_loss": float(loss[-1]),
                "runtime_flags": list(flags),
            }
        ),
        flush=True,
    )


def relative_difference(ours: Path, theirs: Path) -> float:
    a, b = np.load(ours), np.load(theirs)
    num = sum(float(np.sum((a[n] - b[n]) ** 2)) for n in a.files)
    return (num / sum(float(np.sum(b[n] ** 2)) for n in b.files)) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--size", default="gpt-b32")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--calls", type=int, default=8, help="timed calls per variant")
    parser.add_argument("--module", action="append", default=[], help="NAME=VMFB_DIR")
    parser.add_argument("--flags", action="append", default=[], help="NAME=FLAG[,FLAG...]")
    parser.add_argument("--out", type=Path, help="JSON results file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--vmfb-dir", help=argparse.SUPPRESS)
    parser.add_argument("--runtime-flags", default="", help=argparse.SUPPRESS)
    parser.add_argument("--params-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    flag_sets = [f.split("=", 1) for f in args.flags] or [["default", ""]]
    rows, reference = [], None
    with tempfile.TemporaryDirectory() as scratch:
        for name, vmfb_dir in (m.split("=", 1) for m in args.module):
            for flags_name, flags in flag_sets:
                params_out = Path(scratch) / f"{name}-{flags_name}.npz"
                command = [
                    sys.executable, __file__, "--child", "--backend", args.backend,
                    "--size", args.size, "--precision", args.precision,
                    "--calls", str(args.calls), "--vmfb-dir", vmfb_dir,
                    f"--runtime-flags={flags}", "--params-out", str(params_out),
                ]  # fmt: skip
                try:
                    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
                except subprocess.TimeoutExpired:
                    done = subprocess.CompletedProcess(command, 1, "", "timed out after 240 s")
                row = {"module": name, "flags": flags_name, "precision": args.precision}
                result = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
                if done.returncode or not result:
                    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                    row["error"] = " / ".join(tail)[-300:]
                else:
                    row |= json.loads(result[0].removeprefix("RESULT "))
                    reference = reference or params_out
                    row["params_rel_diff"] = relative_difference(params_out, reference)
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    heading = f"{args.precision} ms/step (min-max)"
    print(f"| module | runtime flags | {heading} | loss | params vs first |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['module']} | {r['flags']} | failed: {r['error']} | | |")
            continue
        print(
            f"| {r['module']} | {r['flags']} | {r['ms_per_step']} ({r['min_ms']}-{r['max_ms']}) "
            f"| {r['final_loss']:.4f} | {r['params_rel_diff']:.1e} |"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
