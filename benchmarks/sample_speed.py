"""`pcp sample`'s tokens/s with and without the key/value cache, side by side, on the CPU.

GPT-2 small (12 layers, 768 wide, 1024-token block, a 50257-token vocabulary) with
freshly initialised weights, a prompt of `--context` token ids, `--tokens` new ones
drawn with one seed by each sampler: the uncached one (`pcp sample`: jax on the CPU,
the whole block a token) and the cached one (`pcp sample --backend cpu`: IREE llvm-cpu,
a prefill of the prompt and then one position a token). Both run the library functions
`pcp sample` runs, on token ids (no tokenizer has 50257 tokens here), each compiled
before it is timed. The rates are over all the tokens, and over those after the first
(the cached sampler's first reads the whole prompt, as every uncached token does).
Checks that both draw the same ids, and writes benchmarks/results/sample_speed.json.

    OPENBLAS_NUM_THREADS=1 python benchmarks/sample_speed.py --tokens 64     # 512, 64 tokens
    OPENBLAS_NUM_THREADS=1 python benchmarks/sample_speed.py --model-size tiny --context 32
"""

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pcp_core import plugins
from pcp_core.iree.inference import decoder_for
from pcp_core.program import decoding, nanogpt, sampling
from pcp_core.program.trained import TrainedModel

RESULTS = Path(__file__).parent / "results" / "sample_speed.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-size", default="gpt2-small")
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--backend", default="cpu")
    args = parser.parse_args()
    host = plugins.host()
    config = nanogpt.MODEL.config({"vocab_size": args.vocab}, args.model_size)
    params = nanogpt.init(config, seed=0)
    run = TrainedModel(nanogpt.MODEL, config, params, tokenizer=None, metadata={})
    prompt = [int(i) for i in np.random.default_rng(1).integers(0, args.vocab, args.context)]

    def chooser() -> Callable[[np.ndarray], int]:
        rng = np.random.default_rng(7)
        return lambda logits: sampling.pick(logits, 1.0, None, rng)

    uncached = sampling.generate(nanogpt.MODEL, config, params, prompt, args.tokens, chooser())
    opened = time.perf_counter()
    decoder = decoder_for(host.backend(args.backend), None, run)
    opening = time.perf_counter() - opened
    cached = decoding.generate(decoder, config["block_size"], prompt, args.tokens, chooser())
    result = {
        "model_size": args.model_size,
        "vocab": args.vocab,
        "context": args.context,
        "tokens": args.tokens,
        "uncached_tokens_per_s": uncached.tokens_per_s,
        f"cached_{args.backend}_tokens_per_s": cached.tokens_per_s,
        "speedup": cached.tokens_per_s / uncached.tokens_per_s,
        "uncached_later_tokens_per_s": uncached.later_tokens_per_s,
        f"cached_{args.backend}_later_tokens_per_s": cached.later_tokens_per_s,
        "cached_first_token_s": cached.first_seconds,
        "same_ids": uncached.ids == cached.ids,
        "cached_compile_or_load_s": opening,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    print(json.dumps(result, indent=1))
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
