"""Compile GPT-2 small bf16, K=1, for IREE cuda sm_80 (the kernel profile's module)."""

import sys
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")
import step_time

from pcp_core import plugins
from pcp_core.data import text as data
from pcp_core.iree.compiler import compile_program

backend = plugins.host().backend("cuda")
started = time.perf_counter()
_, program = step_time.build(step_time.SIZES["gpt2-small"], data.load_text_file(None), "bf16", 1)
stablehlo = program.stablehlo_for(backend.runtime.unroll_steps)
print("built", round(time.perf_counter() - started, 1), flush=True)
compiled = compile_program(stablehlo, backend, "sm_80")
out = step_time.module_path(Path(".device/rt/vmfb"), "gpt2-small", "bf16", backend, 1)
out.parent.mkdir(parents=True, exist_ok=True)
out.write_bytes(compiled.vmfb)
print("compiled", out, len(compiled.vmfb), round(time.perf_counter() - started, 1), flush=True)
