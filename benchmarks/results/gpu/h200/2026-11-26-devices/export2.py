"""On the GPU machine: the cuda step for one device holds cuDNN's attention; for a mesh
of two (exported here, where one GPU is all there is) it is the portable form."""

import json

import jax
import pcp_adamw
from pcp_xla import BACKEND
from pcp_xla.runtime import XLA

from pcp_core.optimizers import InnerSettings
from pcp_core.program import nanogpt
from pcp_core.program.build import build_train_program

config = nanogpt.MODEL.config(
    {"n_layer": 2, "n_head": 2, "n_embd": 128, "block_size": 64, "vocab_size": 256}
)
program = build_train_program(
    nanogpt.MODEL, config, pcp_adamw.build(InnerSettings()), 2, 8, precision="bf16"
)
found = {}
for devices in (1, 2):
    exported = jax.export.deserialize(bytearray(XLA.build(program, BACKEND, "cuda", devices).data))
    text = exported.mlir_module()
    found[devices] = {"nr_devices": exported.nr_devices, "cudnn": "cudnn$fmha" in text}
print(json.dumps(found))
