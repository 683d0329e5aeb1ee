"""On the two-GPU machine: GPT-2 small's bf16 step (vocabulary 8192, block 1024, 10
steps a call) exported for a mesh of both GPUs, by this process that has them (so with
cuDNN's attention on each GPU's half of the batch), and timed: ms a step at batch 32."""

import json
import sys
import time

import jax
import numpy as np
import pcp_adamw
from pcp_xla import BACKEND
from pcp_xla.runtime import XLA

from pcp_core.optimizers import InnerSettings
from pcp_core.program import nanogpt
from pcp_core.program.build import build_train_program

devices, batch = int(sys.argv[1]), int(sys.argv[2])
config = nanogpt.MODEL.config(
    {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024, "vocab_size": 8192}
)
program = build_train_program(
    nanogpt.MODEL, config, pcp_adamw.build(InnerSettings()), 10, batch, precision="bf16"
)
started = time.perf_counter()
artifact = XLA.build(program, BACKEND, "cuda", devices)
text = jax.export.deserialize(bytearray(artifact.data)).mlir_module()
executor = XLA.open(artifact.data, BACKEND, program, tuple(range(devices)))
params = [np.asarray(a) for a in nanogpt.MODEL.init(config, 0).values()]
executor.set_params(params)
executor.set_opt_state(program.init_opt_state(params))
rng = np.random.default_rng(0)
tokens = rng.integers(0, 8192, (10, batch, 1025), dtype=np.int32)
inputs, targets = tokens[:, :, :-1], tokens[:, :, 1:]
executor.run(inputs, targets)
ready = time.perf_counter() - started
times = []
for _ in range(5):
    t = time.perf_counter()
    losses = executor.run(inputs, targets)
    times.append((time.perf_counter() - t) / 10 * 1000)
print(
    json.dumps(
        {
            "devices": devices,
            "batch": batch,
            "cudnn": "cudnn$fmha" in text,
            "ms_per_step": [round(x, 2) for x in times],
            "ready_s": round(ready, 1),
            "loss": float(losses[-1]),
        }
    ),
    flush=True,
)
