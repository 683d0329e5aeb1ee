"""Call 5's PCP step for Nsight Compute, in a process without torch (it crashed as well).

A warm-up call of PCP's `xla` step, then one call between cuProfilerStart and
cuProfilerStop (`torch_anchor.ncu_range`), from the repository root:
    ncu --profile-from-start off ... python3 benchmarks/results/gpu/h200/2026-11-29-power/xla_ncu.py
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[4]))  # benchmarks/

import torch_anchor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="gpt2-small", help="a size of step_time.SIZES")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--precision", choices=["f32", "bf16"], default="bf16")
    parser.add_argument("--steps-per-call", type=int, default=1)
    parser.add_argument("--variant", choices=list(torch_anchor.XLA_VARIANTS), default="pcp")
    args = parser.parse_args()

    from pcp_core.data import text as data
    from pcp_core.program import nanogpt

    corpus = data.load_text_file(None)
    size = torch_anchor.size_of(args)
    vocab = size.get("vocab_size", corpus.vocab_size)
    config = nanogpt.MODEL.config({**size["model"], "vocab_size": vocab})
    params = nanogpt.init(config, 0)
    program = torch_anchor.xla_program(args, config, args.batch)
    batches = [
        corpus.batches("train", args.steps_per_call, args.batch, config["block_size"], (0, call))
        for call in range(2)
    ]
    for _ in torch_anchor.xla_calls(args.variant, program, params, batches, ncu=True):
        pass


if __name__ == "__main__":
    main()
