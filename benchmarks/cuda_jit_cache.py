"""How long an IREE `cuda` worker takes to load its module, the first time and the next.

The CUDA driver compiles a module's PTX for the GPU as the module loads (IREE 3.13 emits
sm_80 PTX, which Hopper compiles at load time) and keeps the result in its JIT cache
(~/.nv/ComputeCache, 256 MiB, unless CUDA_CACHE_PATH and CUDA_CACHE_MAXSIZE say
otherwise). Each module here is loaded in two fresh processes, one after the other, with
CUDA's defaults but for an empty cache of its own (CUDA_CACHE_PATH). The figures are the
seconds PCP's executor takes to load the module (IREE creates its executables, and the
driver compiles or finds their code), and the cache's size after the first.

    python benchmarks/cuda_jit_cache.py MODULE.vmfb [...] --out results.md

Modules from `step_time.py --compile-only --backend cuda`. Writes a Markdown table and,
beside it, JSON.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

LOAD = """
import sys, time
from pcp_core import plugins
from pcp_core.iree.executor import IreeExecutor
runtime = plugins.host().backend("cuda").runtime
vmfb = open(sys.argv[1], "rb").read()
started = time.perf_counter()
IreeExecutor(vmfb, runtime.driver, [], [], None, runtime.runtime_flags)
print(time.perf_counter() - started)
"""


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def load_seconds(module: Path, environment: dict[str, str]) -> float:
    """Seconds to load `module` in a new process with `environment`."""
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(module)],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"loading {module.name} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def measure(module: Path, scratch: Path) -> dict:
    """The module loaded twice, the first time from an empty JIT cache."""
    cache = Path(tempfile.mkdtemp(dir=scratch))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_CACHE")}
    environment["CUDA_CACHE_PATH"] = str(cache)
    first = load_seconds(module, environment)
    size = directory_bytes(cache)
    row = {
        "module": module.name,
        "module_bytes": module.stat().st_size,
        "first_load_s": round(first, 2),
        "cache_bytes": size,
        "second_load_s": round(load_seconds(module, environment), 2),
    }
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| module | MB | first load (s) | JIT cache after (MB) | second load (s) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['module']} | {row['module_bytes'] / 2**20:.1f} | "
            f"{row['first_load_s']} | {row['cache_bytes'] / 2**20:.1f} | {row['second_load_s']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", type=Path, nargs="+", help="IREE cuda modules (.vmfb)")
    parser.add_argument("--out", type=Path, required=True, help="the Markdown table")
    args = parser.parse_args()
    missing = [str(m) for m in args.modules if not m.is_file()]
    if missing:
        parser.error(f"no such module: {', '.join(missing)}")
    with tempfile.TemporaryDirectory() as scratch:
        rows = [measure(module, Path(scratch)) for module in args.modules]
    command = "python benchmarks/cuda_jit_cache.py " + " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(f"    {command}\n\n{table(rows)}")
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}))
    print(table(rows))


if __name__ == "__main__":
    main()
