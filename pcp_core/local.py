"""The built-in `local` algorithm: one process trains on one device.

Checkpoints at every evaluation, so an interrupted run keeps what it had learned.
"""

import time
from typing import Any

import numpy as np
import structlog

from pcp_core import checkpoint
from pcp_core.algorithms import Algorithm, RunContext
from pcp_core.compiler import compile_program
from pcp_core.config import ConfigError, to_dict
from pcp_core.executor import IreeExecutor, open_device
from pcp_core.training import TrainingSetup, prepare, resolve_backend

log = structlog.get_logger(__name__)


def save_checkpoint(
    ctx: RunContext,
    setup: TrainingSetup,
    params: list[np.ndarray],
    step: int,
    extra: dict[str, np.ndarray] | None = None,
) -> None:
    tensors = dict(zip(setup.param_names(), params, strict=True)) | (extra or {})
    metadata = {
        "step": step,
        "model": setup.config.model,
        "model_config": setup.model_config,
        "vocabulary": setup.corpus.vocabulary,
    }
    checkpoint.save(ctx.run_dir / "checkpoint.safetensors", tensors, metadata)


def run_local(ctx: RunContext) -> dict[str, Any]:
    config = ctx.config
    if config.steps % config.steps_per_call:
        raise ConfigError(
            f"steps ({config.steps}) must be a multiple of steps_per_call ({config.steps_per_call})"
        )
    backend, arch = resolve_backend(config, ctx.plugins)
    setup = prepare(config, ctx.plugins)
    program = setup.program
    open_device(backend.driver, config.device, backend.install_hint)  # before compiling
    compiled = compile_program(program.stablehlo, backend, arch)
    executor = IreeExecutor(
        compiled.vmfb, backend.driver, program.param_specs, program.opt_specs, config.device
    )
    params = setup.initial_params()
    executor.set_params(params)
    executor.set_opt_state(program.init_opt_state(params))
    log.info(
        "training",
        backend=backend.name,
        arch=arch,
        params=sum(p.size for p in params),
        unigram_entropy=round(setup.corpus.unigram_entropy(), 3),
    )

    ctx.progress.start(config.steps, f"training on {backend.name}")
    tokens_per_call = setup.tokens_per_step() * config.steps_per_call
    block = setup.model_config["block_size"]
    step, tokens, compute_s, val_loss = 0, 0, 0.0, None
    for call in range(config.steps // config.steps_per_call):
        x, y = setup.corpus.batches(
            "train", config.steps_per_call, config.batch_size, block, stream=(config.seed, call)
        )
        started = time.perf_counter()
        losses = executor.run(x, y)
        compute_s += time.perf_counter() - started
        step += config.steps_per_call
        tokens += tokens_per_call
        record: dict[str, Any] = {
            "step": step,
            "loss": float(losses[-1]),
            "loss_mean": float(losses.mean()),
            "tokens": tokens,
            "elapsed_s": round(ctx.metrics.elapsed(), 4),
        }
        last = step == config.steps
        if last or (config.eval_every and step % config.eval_every < config.steps_per_call):
            params = executor.params()
            val_loss = setup.validation_loss(params)
            record["val_loss"] = val_loss
            save_checkpoint(ctx, setup, params, step)
        if not np.isfinite(losses).all():
            raise FloatingPointError(f"loss became {losses[-1]} at step {step}; lower --lr")
        ctx.metrics.write(record)
        ctx.progress.update(step, loss=record["loss"], tokens_per_s=tokens / compute_s)

    final_loss = float(losses[-1])
    return {
        "final_train_loss": final_loss,
        "final_val_loss": val_loss,
        "unigram_entropy": setup.corpus.unigram_entropy(),
        "tokens": tokens,
        "tokens_per_s": tokens / compute_s,
        "wall_time_s": ctx.metrics.elapsed(),
        "compile_cache_hit": compiled.cache_hit,
        "backend": backend.name,
        "arch": arch,
        "parameters": int(sum(p.size for p in setup.initial_params())),
        "config": to_dict(config),
    }


LOCAL = Algorithm(name="local", run=run_local, description="single process, single device")
