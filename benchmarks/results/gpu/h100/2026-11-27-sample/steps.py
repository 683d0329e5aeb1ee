"""The cached sampler's IREE modules across two device calls (the GPU machine has no
IREE compiler): `dump` writes the StableHLO of the step functions as the GPU machine's
jax writes them, for the run's model and for GPT-2 small (sample_speed.py's); `compile`
compiles those here for a backend into a compile cache, which `pcp sample --backend
cuda` then finds on the GPU machine (the cache key is the text, the target, the flags
and IREE's version).

    python steps.py dump RUN_DIR OUT_DIR          # on the GPU machine
    PCP_CACHE_DIR=CACHE python steps.py compile OUT_DIR cuda sm_80   # here
"""

import sys
from pathlib import Path

from pcp_core import plugins
from pcp_core.iree.compiler import compile_program
from pcp_core.program import decoding, nanogpt, trained


def dump(run_dir: Path, out: Path) -> None:
    run = trained.load(run_dir)
    gpt2 = nanogpt.MODEL.config({"vocab_size": 50257}, "gpt2-small")  # as sample_speed.py
    for name, model, config in (("run", run.model, run.config), ("gpt2", nanogpt.MODEL, gpt2)):
        for step, text in decoding.stablehlo(model, config).items():
            (out / f"{name}.{step}.mlir").write_text(text)


def compile_all(folder: Path, backend_name: str, arch: str) -> None:
    backend = plugins.host().backend(backend_name)
    for path in sorted(folder.glob("*.mlir")):
        compiled = compile_program(path.read_text(), backend, arch)
        print(path.name, len(compiled.vmfb), "bytes")


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        Path(sys.argv[3]).mkdir(parents=True, exist_ok=True)
        dump(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        compile_all(Path(sys.argv[2]), sys.argv[3], sys.argv[4])
