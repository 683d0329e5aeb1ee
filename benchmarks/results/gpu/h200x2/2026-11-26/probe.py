"""On the two-GPU machine: the reference program's first call on GPU 0 and on a mesh of
GPUs 0 and 1, f32 and bf16, each step's traceback printed where it fails (the two-GPU
worker of call 1 exited at load, and a worker's log did not come back)."""

import json
import traceback

import jax
import numpy as np
from pcp_xla import BACKEND
from pcp_xla.runtime import XLA

from pcp_core.program.build import build_train_program
from pcp_core.testing.reference import BATCH, STEPS_PER_CALL, initial_params, reference

print("jax", jax.__version__, jax.devices())
corpus, config, program = reference()
params = initial_params(config)
batch = corpus.batches("train", STEPS_PER_CALL, BATCH, config["block_size"], (0, 0))
for precision in ("f32", "bf16"):
    if precision == "bf16":
        import pcp_adamw

        from pcp_core.optimizers import InnerSettings
        from pcp_core.program import nanogpt

        program = build_train_program(
            nanogpt.MODEL,
            config,
            pcp_adamw.build(InnerSettings()),
            STEPS_PER_CALL,
            BATCH,
            precision="bf16",
        )
    ends = []
    for devices in (None, (0, 1)):
        label = f"{precision} devices={devices}"
        try:
            artifact = XLA.build(program, BACKEND, "cuda", 1 if devices is None else 2)
            executor = XLA.open(artifact.data, BACKEND, program, devices)
            executor.set_params(params)
            executor.set_opt_state(program.init_opt_state(params))
            losses = executor.run(*batch)
            ends.append((losses, executor.params()))
            print(label, "ok", losses[:2])
        except BaseException:
            print(label, "FAILED")
            traceback.print_exc()
    if len(ends) == 2:
        print(
            precision,
            json.dumps(
                {
                    "losses": float(np.max(np.abs(ends[0][0] - ends[1][0]))),
                    "params": max(
                        float(np.max(np.abs(a - b)))
                        for a, b in zip(ends[0][1], ends[1][1], strict=False)
                    ),
                }
            ),
        )
