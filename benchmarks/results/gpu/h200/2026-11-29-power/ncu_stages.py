"""How far PCP's step process gets under ncu: stage 1 imports PCP and runs a small jitted
product; 2 also builds the train program; 3 also exports and compiles it for the GPU;
4 also runs a call. Call 9 runs each stage under ncu; the first that crashes is where."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[4]))  # benchmarks/

import torch_anchor


def main(stage: int) -> None:
    import argparse

    import jax
    import jax.numpy as jnp

    from pcp_core import plugins
    from pcp_core.data import text as data
    from pcp_core.program import nanogpt

    backend = plugins.host().backend("xla")
    x = jnp.ones((1024, 1024))
    print("stage 1: product", float(jax.jit(lambda a: (a @ a).sum())(x)), flush=True)
    if stage < 2:
        return
    args = argparse.Namespace(size="gpt2-small", steps_per_call=1, precision="bf16")
    corpus = data.load_text_file(None)
    size = torch_anchor.size_of(args)
    vocab = size.get("vocab_size", corpus.vocab_size)
    config = nanogpt.MODEL.config({**size["model"], "vocab_size": vocab})
    params = nanogpt.init(config, 0)
    program = torch_anchor.xla_program(args, config, 16)
    print("stage 2: program built", flush=True)
    if stage < 3:
        return
    artifact = backend.runtime.build(program, backend, backend.resolve_arch()).data
    print("stage 3a: exported", len(artifact), "bytes", flush=True)
    executor = backend.runtime.open(artifact, backend, program, None)
    print("stage 3b: compiled", flush=True)
    if stage < 4:
        return
    initial = list(params.values())
    executor.set_params(initial)
    executor.set_opt_state(program.init_opt_state(initial))
    batch = corpus.batches("train", 1, 16, config["block_size"], (0, 0))
    print("stage 4: a call, losses", list(executor.run(*batch)), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
