"""SparseLoCo's shepherd side: its rounds (a worker's round is the engine's
`steps_from_global`; what makes it SparseLoCo's is the codec and its feedback).

The sparse messages are the core's codec machinery at work: the run names the `sparse2`
codec for both directions with the run's density and chunk (`RunSettings.codec_options`)
and the accumulator's decay (`RunSettings.feedback_decay`). A worker's error feedback is
its accumulator, saved and restored with its inner state; the shepherd's copy of the
parameters the workers hold (`Shepherd.downlink`) is the downlink's, saved with each
checkpoint, so `--resume` goes on along the same trajectory.
"""

import dataclasses
import json
import math
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from pcp_core.engine import (
    HELD_PREFIX,
    Assignment,
    ConfigError,
    OneInFlight,
    RoundOutcome,
    RunConfig,
    RunContext,
    RunSettings,
    Utilisation,
    outcome_record,
    prepare,
    report_results,
    shepherd,
    worker_losses,
    worker_steps,
)
from pcp_sparseloco import SparseLocoSettings

log = structlog.get_logger(__name__)

CODEC = "sparse2"


@dataclass
class RunState:
    """Where the run is: saved with every checkpoint, so `--resume` continues from it."""

    run_id: str  # a worker's saved inner state (and accumulator) is only used for it
    next_round: int = 0
    tokens: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    val_loss: float | None = None


# Aggregators that merge value by value: a value that one worker of several sent (most
# of a sparse message's) is an outlier to them, so they would merge it away.
VALUE_WISE_AGGREGATORS = ("trimmed-mean", "median")


def plan(config: RunConfig) -> RunConfig:
    """The config the workers' program is built from: calls of the largest number of
    steps that divides both --steps-per-call and H, and the workers' learning rate for
    M workers; ConfigError for an aggregator that would merge the messages away."""
    settings: SparseLocoSettings = config.settings("sparseloco")
    if config.shepherd.aggregator in VALUE_WISE_AGGREGATORS:
        raise ConfigError(
            f"--aggregator {config.shepherd.aggregator} merges value by value, and most "
            "values of a sparse message come from one worker: it would merge them away. "
            "Use mean or centered-clip with sparseloco"
        )
    steps_per_call = math.gcd(config.steps_per_call, settings.inner_steps)
    return settings.with_workers_lr(dataclasses.replace(config, steps_per_call=steps_per_call))


def run_settings(config: RunConfig, run_id: str) -> RunSettings:
    """What every worker is told: the sparse codec both ways, the accumulator's decay, and
    whether its results are spot-checked (`--spot-check`). A resumed run asks again for
    up to --checkpoint-every rounds, one more where the last checkpoint was still being
    written: each needs the inner state (and accumulator) it started from."""
    settings: SparseLocoSettings = config.settings("sparseloco")
    return RunSettings(
        algorithm="sparseloco",
        run_id=run_id,
        inner_states_kept=config.shepherd.checkpoint_every + 2,
        codec=CODEC,
        codec_down=CODEC,
        codec_options={"density": settings.density, "chunk": settings.chunk},
        codec_down_options={"density": settings.down_density, "chunk": settings.chunk},
        feedback_decay=settings.feedback_decay,
        audited=config.shepherd.spot_check > 0,
    )


def run(ctx: RunContext) -> dict[str, Any]:
    """Round after round: the workers' sparse messages averaged, the global parameters
    moved by that times the outer learning rate. The run's summary."""
    config = plan(ctx.config)
    settings: SparseLocoSettings = config.settings("sparseloco")
    steps, workers = settings.inner_steps, config.shepherd.workers
    trainers = config.local_worker_backends() if ctx.local_workers else []
    setup = prepare(config, ctx.plugins, trainers=trainers, shepherd=True)
    params = setup.initial_params()
    state, held = RunState(uuid.uuid4().hex), dict[str, np.ndarray]()
    if ctx.resume:
        state, held = resume(ctx, setup, params)
    mean = [np.zeros_like(p) for p in params]  # each round's merged message (run_round)
    rounds = max(1, config.steps // steps)
    ctx.status.describe(rounds=rounds, model=config.model, parameters=setup.program.parameter_count)
    record: dict[str, Any] = {}
    saving = OneInFlight("checkpoint")
    with shepherd(ctx, setup, run_settings(config, state.run_id)) as herd:
        herd.downlink().load_state(held)
        herd.wait_for_workers(workers, config.shepherd.join_timeout)
        utilisation = Utilisation(workers)
        ctx.progress.start(rounds * steps, f"sparseloco on {workers} workers")
        for index in range(state.next_round, rounds):

            def assignment(worker: int, index: int = index) -> Assignment:
                return Assignment(index, steps, (worker + index) % workers, workers, config.seed)

            outcome = herd.run_round(index, params, mean, assignment)
            for param, moved in zip(params, mean, strict=True):
                param -= np.float32(settings.outer_lr) * moved
            record = round_record(ctx, setup, outcome, state, index)
            if index == rounds - 1 or setup.evaluates_after(record["step"], steps):
                state.val_loss = record["val_loss"] = setup.validation_loss(params)
            ctx.metrics.write(record | utilisation.round(outcome.results))
            ctx.progress.update(record["step"], loss=record["loss"])
            if index == rounds - 1 or state.next_round % config.shepherd.checkpoint_every == 0:
                saving.wait()  # the last checkpoint, before this one
                saving.submit(checkpoint(ctx, setup, params, herd.downlink().state(), state))
        saving.wait()
    wall_time_s = ctx.metrics.elapsed()
    loss, tokens = record.get("loss", math.nan), state.tokens
    summary = setup.summary(loss, state.val_loss, tokens, tokens / wall_time_s, wall_time_s)
    return summary | {
        "rounds": rounds,
        "bytes_sent": state.bytes_sent,
        "bytes_received": state.bytes_received,
        **utilisation.summary(),  # each worker's busy share of the training phase
    }


def round_record(
    ctx: RunContext, setup: Any, outcome: RoundOutcome, state: RunState, index: int
) -> dict[str, Any]:
    """Round `index` done: the run status told what each worker did, where the run is
    moved on, and the round's metrics record."""
    steps_per_call = ctx.config.steps_per_call
    losses, steps_run = worker_losses(outcome, steps_per_call), worker_steps(outcome)
    report_results(ctx.status, outcome, losses, steps_run, setup.tokens_per_step())
    state.next_round = index + 1
    state.tokens += sum(steps_run.values()) * setup.tokens_per_step()
    state.bytes_sent += outcome.bytes_sent
    state.bytes_received += outcome.bytes_received
    return {
        "round": index,
        "step": state.next_round * ctx.config.settings("sparseloco").inner_steps,
        "loss": float(np.mean(list(losses.values()))),
        "worker_losses": losses,
        "tokens": state.tokens,
    } | outcome_record(outcome)


def checkpoint(
    ctx: RunContext,
    setup: Any,
    params: list[np.ndarray],
    held: dict[str, np.ndarray],
    state: RunState,
) -> Any:
    """A round's checkpoint, written on the saving thread: copies of the parameters,
    the copy the workers hold, and where the run is."""
    params = [p.copy() for p in params]
    metadata = {"sparseloco": dataclasses.asdict(state)}
    step = state.next_round * ctx.config.settings("sparseloco").inner_steps

    def write() -> None:
        setup.save_checkpoint(ctx.run_dir, params, step, extra=held, resume=metadata)

    return write


def resume(
    ctx: RunContext, setup: Any, params: list[np.ndarray]
) -> tuple[RunState, dict[str, np.ndarray]]:
    """Load the run directory's last intact checkpoint into `params`; where the run is,
    and the copy of the parameters the workers held. The metrics of later rounds go
    (they are run again)."""
    metadata, tensors = setup.resume_from(ctx.run_dir, params, "sparseloco")
    state = RunState(**json.loads(metadata["sparseloco"]))
    ctx.metrics.keep_only(lambda record: record.get("round", -1) < state.next_round)
    log.info("resuming", run_dir=str(ctx.run_dir), round=state.next_round)
    return state, {k: v for k, v in tensors.items() if k.startswith(HELD_PREFIX)}
