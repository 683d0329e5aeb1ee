"""The built-in `local` algorithm: one process trains on one device.

Checkpoints at every evaluation, so an interrupted run keeps what it had learned, and
`--resume RUN_DIR` continues it: the checkpoint holds the inner optimizer's state beside
the parameters, and the data of each call depends only on the seed and the call, so a
resumed run follows the trajectory the uninterrupted one would have. The
loop keeps the device busy: the eval program is compiled before the first step, an
executor that can (`params_snapshot`, pcp-xla) hands the evaluation and the checkpoint
a copy of the parameters made by the device (in pinned host memory on a GPU), taken
once before the first step too, so its first-time costs land there, and the checkpoint
is written on a thread while training goes on (benchmarks/loop_time.py).
"""

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from pcp_core.algorithms import RunContext
from pcp_core.backends import Artifact, Backend
from pcp_core.config import ConfigError
from pcp_core.program import checkpoint as checkpoints_file
from pcp_core.program.background import OneInFlight
from pcp_core.program.build import SCHEDULE_TENSOR
from pcp_core.program.training import TrainingSetup, prepare, resolve_backend

log = structlog.get_logger(__name__)

Snapshot = Callable[[], list[Any]]  # an executor's `params_snapshot`


def run_local(ctx: RunContext) -> dict[str, Any]:
    config = ctx.config
    if config.steps % config.steps_per_call:
        raise ConfigError(
            f"steps ({config.steps}) must be a multiple of steps_per_call ({config.steps_per_call})"
        )
    backend, arch = resolve_backend(config, ctx.plugins)
    setup = prepare(config, ctx.plugins)
    ctx.status.describe(model=config.model, parameters=setup.program.parameter_count)
    executor, artifact = _open_executor(ctx, setup, backend, arch)
    position = _resumed(ctx, executor, setup) if ctx.resume else Position()
    snapshot = _ready_to_evaluate(setup, executor)
    checkpoints = OneInFlight("checkpoint")
    log.info(
        "training",
        backend=backend.name,
        arch=arch,
        unigram_entropy=round(setup.corpus.unigram_entropy(), 3),
    )
    ctx.progress.start(config.steps, f"training on {backend.name}")
    ctx.status.worker_state(0, "training", inner_steps=config.steps)
    losses, val_loss, tokens, compute_s = _train(
        ctx, setup, executor, snapshot, checkpoints, position
    )
    checkpoints.wait()  # the last one is written before the summary says whether it was

    summary = setup.summary(
        float(losses[-1]), val_loss, tokens, tokens / max(compute_s, 1e-9), ctx.metrics.elapsed()
    )
    return summary | {"arch": arch, "compile_cache_hit": artifact.cache_hit}


OPT_PREFIX = "optimizer."  # the inner optimizer's state in a checkpoint


@dataclass(frozen=True)
class Position:
    """Where a local run is: saved with each checkpoint, read back by `--resume`."""

    step: int = 0
    tokens: int = 0

    def metadata(self) -> dict[str, Any]:
        return {"local": {"step": self.step, "tokens": self.tokens}}


def _open_executor(
    ctx: RunContext, setup: TrainingSetup, backend: Backend, arch: str
) -> tuple[Any, Artifact]:
    """The program compiled and opened on the device, holding the initial parameters."""
    program = setup.program
    runtime = backend.runtime
    runtime.require_device(backend, ctx.config.device)  # before compiling
    ctx.status.worker_joined(0, "local", backend.name, arch, "this process")
    ctx.status.worker_state(0, "compiling")
    artifact = runtime.build(program, backend, arch)
    executor = runtime.open(artifact.data, backend, program, ctx.config.device)
    initial = setup.initial_params()  # 500 MB of host memory for GPT-2 small, let go on return
    executor.set_params(initial)
    executor.set_opt_state(program.init_opt_state(initial))
    return executor, artifact


def _resumed(ctx: RunContext, executor: Any, setup: TrainingSetup) -> Position:
    """Where `--resume` continues: the checkpoint loaded, its later metrics dropped."""
    position = resume(ctx.run_dir, executor, setup)
    if position.step >= ctx.config.steps:
        raise ConfigError(
            f"the run in {str(ctx.run_dir)!r} has trained its {ctx.config.steps} steps; "
            "pass a larger --steps to train further"
        )
    ctx.metrics.keep_only(lambda record: record.get("step", 0) <= position.step)
    return position


def _ready_to_evaluate(setup: TrainingSetup, executor: Any) -> Snapshot | None:
    """The executor's snapshot, if any; it and the evaluation are set up now, not mid-loop."""
    setup.evaluator.load()  # every run evaluates at its end: compile that now, not mid-loop
    snapshot: Snapshot | None = getattr(executor, "params_snapshot", None)
    if snapshot is not None:
        # The first snapshot and evaluation set up their copies and the host memory they
        # use (0.3-0.5 s for GPT-2 small on an H100): here, not inside the loop.
        before = setup.validation_loss(snapshot())
        log.info("evaluated before training", val_loss=round(before, 4))
    return snapshot


def _train(
    ctx: RunContext,
    setup: TrainingSetup,
    executor: Any,
    snapshot: Snapshot | None,
    checkpoints: OneInFlight,
    position: Position,
) -> tuple[np.ndarray, float | None, int, float]:
    """Train from `position` to the end: the last losses, val loss, tokens and compute s."""
    config, status = ctx.config, ctx.status
    tokens_per_call = setup.tokens_per_step() * config.steps_per_call
    block = setup.model_config["block_size"]
    step, tokens, compute_s, val_loss = position.step, position.tokens, 0.0, None
    losses = np.array([np.nan])
    for call in range(step // config.steps_per_call, config.steps // config.steps_per_call):
        x, y = setup.corpus.batches(
            "train", config.steps_per_call, config.step_batch, block, stream=(config.seed, call)
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
        at = Position(step, tokens)
        if setup.evaluates_after(step, config.steps_per_call):
            record["val_loss"] = val_loss = _evaluate(
                ctx, setup, executor, snapshot, checkpoints, at
            )
        elif setup.saves_after(step, config.steps_per_call):
            checkpoints.submit(
                functools.partial(
                    _checkpoint, ctx, setup, executor.params(), executor.opt_state(), at
                )
            )
        ctx.metrics.write(record)
        ctx.progress.update(step, loss=record["loss"], tokens_per_s=tokens / compute_s)
    return losses, val_loss, tokens, compute_s


def _evaluate(
    ctx: RunContext,
    setup: TrainingSetup,
    executor: Any,
    snapshot: Snapshot | None,
    checkpoints: OneInFlight,
    at: Position,
) -> float:
    """The validation loss at `at`, and its checkpoint started on the thread; the
    snapshot is let go once that is written, so the next one reuses its memory."""
    params = snapshot() if snapshot is not None else executor.params()
    state = executor.opt_state()
    ctx.status.set_state("evaluating", step=at.step)
    val_loss = setup.validation_loss(params)
    ctx.status.set_state("training", step=at.step)
    checkpoints.submit(lambda: _checkpoint(ctx, setup, params, state, at))
    return val_loss


def _checkpoint(
    ctx: RunContext, setup: TrainingSetup, params: list[Any], state: list[Any], at: Position
) -> None:
    """Write the checkpoint (on the checkpoint thread), kept where --save-every says."""
    started = time.perf_counter()
    names = [OPT_PREFIX + spec.name for spec in setup.program.opt_specs]
    optimizer = {name: np.asarray(array) for name, array in zip(names, state, strict=True)}
    step = at.step
    kept = setup.saves_after(step, ctx.config.steps_per_call)
    setup.save_checkpoint(
        ctx.run_dir, [np.asarray(p) for p in params], step, optimizer, at.metadata(), kept
    )
    if setup.checkpoint_error is None:
        seconds = round(time.perf_counter() - started, 3)
        log.info("checkpoint written", step=step, seconds=seconds)


def resume(run_dir: Path, executor: Any, setup: Any) -> Position:
    """Load the newest intact checkpoint of `run_dir` into `executor`: its parameters and
    its inner optimizer's state; where the run was."""
    tensors, metadata = checkpoints_file.load_latest(run_dir / "checkpoint.safetensors")
    if "local" not in metadata:
        raise checkpoints_file.CheckpointError(
            f"{run_dir}: the checkpoint is not from a local run (or from one before local "
            "runs kept their optimizer state), it cannot be resumed"
        )
    saved = json.loads(metadata["local"])
    names = [OPT_PREFIX + spec.name for spec in setup.program.opt_specs]
    missing = [n for n in [*setup.param_names(), *names] if n not in tensors]
    if missing:
        raise checkpoints_file.CheckpointError(
            f"{run_dir}: the checkpoint has no {missing[0]!r}: is it of another model or "
            "optimizer than this run's config?"
        )
    executor.set_params([tensors[name] for name in setup.param_names()])
    # a scalar comes back from the file as one value; the learning-rate schedule is this
    # run's (a larger --steps stretches it), not the checkpoint's
    fresh = setup.program.init_opt_state([tensors[name] for name in setup.param_names()])
    state = [
        now if spec.name == SCHEDULE_TENSOR else tensors[name].reshape(spec.shape)
        for name, spec, now in zip(names, setup.program.opt_specs, fresh, strict=True)
    ]
    executor.set_opt_state(state)
    log.info("resuming", run_dir=str(run_dir), step=saved["step"])
    return Position(saved["step"], saved["tokens"])
