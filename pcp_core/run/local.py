"""The built-in `local` algorithm: one process trains on one device.

Checkpoints at every evaluation, so an interrupted run keeps what it had learned. The
loop keeps the device busy: the eval program is compiled before the first step, an
executor that can (`params_snapshot`, pcp-xla) hands the evaluation and the checkpoint
a copy of the parameters made by the device (in pinned host memory on a GPU), taken
once before the first step too, so its first-time costs land there, and the checkpoint
is written on a thread while training goes on (benchmarks/loop_time.py).
"""

import time
from typing import Any

import numpy as np
import structlog

from pcp_core.algorithms import RunContext
from pcp_core.config import ConfigError
from pcp_core.program.background import OneInFlight
from pcp_core.program.training import prepare, resolve_backend

log = structlog.get_logger(__name__)


def run_local(ctx: RunContext) -> dict[str, Any]:
    config = ctx.config
    if config.steps % config.steps_per_call:
        raise ConfigError(
            f"steps ({config.steps}) must be a multiple of steps_per_call ({config.steps_per_call})"
        )
    backend, arch = resolve_backend(config, ctx.plugins)
    setup = prepare(config, ctx.plugins)
    program = setup.program
    status = ctx.status
    status.describe(model=config.model, parameters=program.parameter_count)
    runtime = backend.runtime
    runtime.require_device(backend, config.device)  # before compiling
    status.worker_joined(0, "local", backend.name, arch, "this process")
    status.worker_state(0, "compiling")
    artifact = runtime.build(program, backend, arch)
    executor = runtime.open(artifact.data, backend, program, config.device)
    initial = setup.initial_params()
    executor.set_params(initial)
    executor.set_opt_state(program.init_opt_state(initial))
    del initial  # 500 MB of host memory for GPT-2 small, not needed again
    setup.evaluator.load()  # every run evaluates at its end: compile that now, not mid-loop
    snapshot = getattr(executor, "params_snapshot", None)
    if snapshot is not None:
        # The first snapshot and evaluation set up their copies and the host memory they
        # use (0.3-0.5 s for GPT-2 small on an H100): here, not inside the loop.
        val_loss = setup.validation_loss(snapshot())
        log.info("evaluated before training", val_loss=round(val_loss, 4))
    checkpoints = OneInFlight("checkpoint")

    def checkpoint(params: list[Any], step: int) -> None:  # on the checkpoint thread
        started = time.perf_counter()
        setup.save_checkpoint(ctx.run_dir, [np.asarray(p) for p in params], step)
        if setup.checkpoint_error is None:
            seconds = round(time.perf_counter() - started, 3)
            log.info("checkpoint written", step=step, seconds=seconds)

    def evaluate(step: int) -> float:
        """The validation loss after `step`, and its checkpoint started on the thread;
        the snapshot is let go once that is written, so the next one reuses its memory."""
        params = snapshot() if snapshot is not None else executor.params()
        status.set_state("evaluating", step=step)
        val_loss = setup.validation_loss(params)
        status.set_state("training", step=step)
        checkpoints.submit(lambda: checkpoint(params, step))
        return val_loss

    log.info(
        "training",
        backend=backend.name,
        arch=arch,
        unigram_entropy=round(setup.corpus.unigram_entropy(), 3),
    )

    ctx.progress.start(config.steps, f"training on {backend.name}")
    status.worker_state(0, "training", inner_steps=config.steps)
    tokens_per_call = setup.tokens_per_step() * config.steps_per_call
    block = setup.model_config["block_size"]
    step, tokens, compute_s, val_loss = 0, 0, 0.0, None
    for call in range(config.steps // config.steps_per_call):
        x, y = setup.corpus.batches(
            "train", config.steps_per_call, config.batch_size, block, stream=(config.seed, call)
        )
        started = time.perf_counter()
        losses = executor.run(x, y)
        call_s = time.perf_counter() - started
        compute_s += call_s
        status.worker_result(0, float(losses[-1]), config.steps_per_call, tokens_per_call, call_s)
        step += config.steps_per_call
        tokens += tokens_per_call
        record: dict[str, Any] = {
            "step": step,
            "loss": float(losses[-1]),
            "loss_mean": float(losses.mean()),
            "tokens": tokens,
            "elapsed_s": round(ctx.metrics.elapsed(), 4),
        }
        if not np.isfinite(losses).all():  # before a checkpoint could keep the broken params
            raise FloatingPointError(f"loss became {losses[-1]} at step {step}; lower --lr")
        if setup.evaluates_after(step, config.steps_per_call):
            record["val_loss"] = val_loss = evaluate(step)
        ctx.metrics.write(record)
        ctx.progress.update(step, loss=record["loss"], tokens_per_s=tokens / compute_s)
    checkpoints.wait()  # the last one is written before the summary says whether it was

    summary = setup.summary(
        float(losses[-1]), val_loss, tokens, tokens / compute_s, ctx.metrics.elapsed()
    )
    return summary | {"arch": arch, "compile_cache_hit": artifact.cache_hit}
