"""The CPU backend: IREE's `llvm-cpu` target and the multi-threaded `local-task` driver.

The architecture is an LLVM CPU name. Detection picks the x86-64 micro-architecture
level the host supports (portable between machines of that level, unlike "host"),
so a VMFB compiled on one machine runs on every worker of the same level. Measured
(benchmarks/step_time.py, IREE 3.13, Zen 5): x86-64-v4 is as fast as "host" (znver5);
x86-64-v3 is 1.5x slower on an AVX-512 machine.

Data tiling (`--iree-global-opt-data-tiling`: matmul operands packed into tiles that fit
the vector registers) makes a shakespeare-char-size step 20% faster, the default model's
5%. It is the GlobalOptimization path: `--iree-opt-data-tiling` (the newer
DispatchCreation path) fails to compile the default model ("large vector sizes").
Ukernels, fast min/max, multi-use fusion gained nothing; aggressive fusion and
`--iree-opt-level=O3` were slower (O3 by 1.5-1.9x).
"""

import platform
from pathlib import Path

from pcp_core import hookimpl
from pcp_core.backends import Backend
from pcp_core.iree.runtime import IreeRuntime

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for


def detect_arch(device: int = 0) -> str | None:
    """The host's level, whichever device: local-task has one, the whole CPU."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "generic"
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = next(
        (ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), []
    )
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= set(flags):
        return "x86-64-v4"
    if {"avx2", "fma", "bmi2"} <= set(flags):
        return "x86-64-v3"
    return "x86-64-v2" if "sse4_2" in flags else "x86-64"


CPU = Backend(
    name="cpu",
    runtime=IreeRuntime(
        target="llvm-cpu",
        driver="local-task",
        arch_flag="--iree-llvmcpu-target-cpu={arch}",
        extra_flags=("--iree-global-opt-data-tiling",),
    ),
    default_arch="generic",
    description="host CPU through IREE llvm-cpu",
    detect_arch=detect_arch,
    slow_precisions=(("bf16", "CPUs without bf16 matrix units emulate every product"),),
)


@hookimpl
def pcp_register_backends(register) -> None:
    register(CPU)
