"""DiLoCo on the shepherd: rounds of (send θ, sum the accepted Δ, average, outer step),
checkpointed every --checkpoint-every rounds so `--resume` can continue the run. A
checkpoint is written on a thread of its own from a copy, while the next round runs: a
model of 500 MB takes seconds to write, which the workers would otherwise wait for."""

import dataclasses
import functools
import json
import math
import resource
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from pcp_core.algorithms import RunContext
from pcp_core.config import ConfigError, RunConfig
from pcp_core.optimizers import OuterSettings
from pcp_core.program import checkpoint
from pcp_core.program.background import OneInFlight
from pcp_core.program.training import prepare
from pcp_core.shepherd import distributed
from pcp_core.shepherd.rounds import Scope
from pcp_core.shepherd.spot_checks import SpotChecks
from pcp_core.shepherd.step_guard import StepGuard
from pcp_core.shepherd.utilisation import Utilisation
from pcp_core.wire.downlink import HELD_PREFIX
from pcp_core.wire.messages import Assignment, RunSettings
from pcp_diloco.budgets import RoundBudget, weigh_by
from pcp_diloco.fragments import of_round
from pcp_diloco.outer_steps import (
    FragmentRound,
    FragmentSteps,
    OuterUpdate,
    guarded_round,
    split_fragments,
)
from pcp_diloco.settings import (
    DilocoSettings,
    DilocoWorkerSettings,
    defaults_for,
    lr_scale,
)

log = structlog.get_logger(__name__)


def plan(config: RunConfig, plugins: Any) -> tuple[RunConfig, int]:
    """The config the workers' program is built from, and the number of rounds: H and the
    outer momentum chosen for its M where left to the default (DilocoSettings.for_workers),
    a steps-per-call that divides a round's steps (H, or H/P with P fragments), the inner
    learning rates of `inner_lr_scale`, the warm-up of `inner_warmup_steps` and the
    momentum decay of `inner_momentum_decay`."""
    given: DilocoSettings = config.settings("diloco")
    diloco = given.for_workers(config.shepherd.workers, config.steps)
    assert diloco.inner_steps is not None  # chosen by for_workers
    if config.steps % diloco.inner_steps:
        raise ConfigError(
            f"steps ({config.steps}) must be a multiple of inner_steps ({diloco.inner_steps})"
        )
    if config.shepherd.spot_check and (
        diloco.overlap != "none" or diloco.fragments > 1 or diloco.round_budget != "steps"
    ):
        raise ConfigError(
            "--spot-check re-runs whole rounds of the whole model as a worker ran them: "
            "it needs --overlap none, --fragments 1 and --round-budget steps"
        )
    steps_per_call = math.gcd(config.steps_per_call, diloco.round_steps)
    scale = inner_lr_scale(config)
    planned = dataclasses.replace(
        config,
        steps_per_call=steps_per_call,
        lr=config.lr * scale,
        min_lr=config.final_lr() * scale,
        warmup_steps=inner_warmup_steps(config),
        plugins={**config.plugins, "diloco": diloco, **inner_momentum_decay(config, plugins)},
    )
    return planned, config.steps // diloco.round_steps


def inner_lr_scale(config: RunConfig) -> float:
    """What the workers' inner learning rates are --lr and --min-lr multiplied by, for M
    workers under `--inner-lr-scaling` (pcp_diloco.settings.lr_scale)."""
    diloco: DilocoSettings = config.settings("diloco")
    return lr_scale(diloco.inner_lr_scaling, config.shepherd.workers) or 1.0


def inner_momentum_decay(config: RunConfig, plugins: Any) -> dict[str, Any]:
    """The inner optimizer's own settings with the workers' momentum decay
    (`--inner-momentum-decay`, or its default where the optimizer's own is left at its
    default and rounds do not overlap), as `config.plugins` holds them; empty for an
    optimizer that declares none."""
    name = getattr(plugins.optimizer(config.optimizer), "momentum_decay_setting", None)
    own = config.plugins.get(config.optimizer)
    if name is None or own is None:
        return {}
    diloco: DilocoSettings = config.settings("diloco")
    chosen = diloco.inner_momentum_decay
    if chosen is None:
        declared = {field.name: field.default for field in dataclasses.fields(own)}
        if getattr(own, name) != declared[name] or diloco.overlap != "none":
            return {}
        chosen = defaults_for(config.shepherd.workers).inner_momentum_decay
    return {config.optimizer: dataclasses.replace(own, **{name: chosen})}


def inner_warmup_steps(config: RunConfig) -> int:
    """The workers' warm-up: --inner-warmup-steps, at most a third of the run, or
    --warmup-steps where that is longer."""
    diloco: DilocoSettings = config.settings("diloco")
    return max(config.warmup_steps, min(diloco.inner_warmup_steps, config.steps // 3))


def schedule_counters(config: RunConfig, plugins: Any, program: Any) -> list[str]:
    """The inner-state tensors a worker sets to the run's position in budgeted rounds
    (`pcp_diloco.budgets`): its optimizer's step counter, whose schedule then follows
    the run's rounds; none under `--round-budget steps` or for an optimizer without one."""
    diloco: DilocoSettings = config.settings("diloco")
    field = getattr(plugins.optimizer(config.optimizer), "step_field", None)
    if diloco.round_budget == "steps" or field is None:
        return []
    return program.opt_field_names(field)


def momentum_to_reset(config: RunConfig, plugins: Any, program: Any) -> list[str]:
    """The inner-state tensors a worker zeroes at the start of each round: the inner
    optimizer's momentum under `--inner-momentum reset`, nothing under `keep` or for an
    optimizer that declares no momentum."""
    diloco: DilocoSettings = config.settings("diloco")
    field = getattr(plugins.optimizer(config.optimizer), "momentum_field", None)
    if diloco.inner_momentum == "keep" or field is None:
        return []
    return program.opt_field_names(field)


def run(ctx: RunContext) -> dict[str, Any]:
    config, rounds = plan(ctx.config, ctx.plugins)
    diloco: DilocoSettings = config.settings("diloco")
    outer = ctx.plugins.optimizer(diloco.outer_optimizer)
    if getattr(outer, "role", None) != "outer":
        raise ConfigError(f"optimizer {diloco.outer_optimizer!r} is not an outer optimizer")
    # fail on an unknown transport or aggregator before compiling
    ctx.plugins.transport(config.shepherd.transport)
    ctx.plugins.aggregator(config.shepherd.aggregator)
    trainers = config.local_worker_backends() if ctx.local_workers else []
    setup = prepare(config, ctx.plugins, trainers=trainers, shepherd=True)
    # said once the settings are known good: a bad one is a one-line error
    log.info("rounds", workers=config.shepherd.workers, rounds=rounds,
             inner_steps=diloco.inner_steps, outer_momentum=diloco.outer_momentum)  # fmt: skip
    if (config.lr, config.warmup_steps) != (ctx.config.lr, ctx.config.warmup_steps):
        log.info("inner learning rate", lr=config.lr, min_lr=config.min_lr, of_lr=ctx.config.lr,
                 workers=config.shepherd.workers, warmup_steps=config.warmup_steps)  # fmt: skip
    own = config.plugins.get(config.optimizer)
    if own is not None and own != ctx.config.plugins.get(config.optimizer):  # `plan` changed it
        log.info("inner optimizer", optimizer=config.optimizer, **dataclasses.asdict(own))
    params = setup.initial_params()
    fragments = split_fragments(setup, diloco.fragments)
    outer_momentum = diloco.outer_momentum
    assert outer_momentum is not None  # chosen by for_workers (plan)
    outer_step = FragmentSteps(
        [[params[i] for i in indices] for indices in fragments],
        lambda part: outer.create(OuterSettings(diloco.outer_lr, outer_momentum), part),
    )
    state, judged = RunState(run_id=uuid.uuid4().hex), Judged({}, {})
    held: dict[str, np.ndarray] = {}
    if ctx.resume:
        state, held, judged = resume(ctx, setup, params, outer_step)
        if not state.goes_on(diloco.round_steps, config.steps):
            raise ConfigError(
                f"the run in {ctx.run_dir} has finished its {config.steps} steps; "
                "pass a larger --steps to train further"
            )
    delta = [np.zeros_like(p) for p in params]  # the mean of a round's pseudo-gradients
    guards = [StepGuard([params[i] for i in indices]) for indices in fragments]
    tokens_per_step = setup.tokens_per_step()
    record: dict[str, Any] = {}

    reset = momentum_to_reset(config, ctx.plugins, setup.program)
    counters = schedule_counters(config, ctx.plugins, setup.program)
    budget = RoundBudget(diloco.round_budget, diloco.round_steps, config.steps_per_call)
    settings = RunSettings(
        algorithm="diloco",
        run_id=state.run_id,
        # a resumed run asks again for up to checkpoint_every rounds, one more where the
        # last checkpoint was still being written: each needs the inner state it started
        # from (pcp_core.worker.state)
        inner_states_kept=config.shepherd.checkpoint_every + 2,
        plugins={
            "diloco": dataclasses.asdict(
                DilocoWorkerSettings(tuple(reset), diloco.fragments, tuple(counters))
            )
        },
        overlap=diloco.overlap != "none",
        push_deltas=diloco.deltas == "pushed",  # and under ahead (RunSettings.pushes)
        ahead=diloco.ahead_rounds if diloco.overlap == "ahead" else 0,
        codec=diloco.codec,
        codec_down=diloco.codec_down,
        audited=config.shepherd.spot_check > 0,
    )
    checkpoints = OneInFlight("checkpoint")
    status = ctx.status
    # budgeted rounds end when the leading worker's steps reach --steps: no count ahead
    planned = rounds if diloco.round_budget == "steps" else None
    status.describe(rounds=planned, model=config.model, parameters=setup.program.parameter_count)
    with distributed.shepherd(ctx, setup, settings) as shepherd:
        status.set_state("waiting for workers", workers=config.shepherd.workers)
        shepherd.downlink().load_state(held)  # a resumed run's workers: the copy they held
        shepherd.merger.combiner.load_state(judged.aggregator)
        shepherd.merger.accountability.load_state(judged.accountability)
        shepherd.wait_for_workers(config.shepherd.workers, config.shepherd.join_timeout)
        utilisation = Utilisation(config.shepherd.workers)
        ctx.progress.start(config.steps, f"diloco on {config.shepherd.workers} workers")
        while state.goes_on(diloco.round_steps, config.steps):
            index, position = state.next_round, state.position(diloco.round_steps)
            shards = max(config.shepherd.workers, *(i + 1 for i in shepherd.links))
            budget_s = budget.seconds()

            def assignment(
                worker: int,
                index: int = index,
                shards: int = shards,
                budget_s: float = budget_s,
                position: int = position,
            ) -> Assignment:
                shard = (worker + index) % shards
                return Assignment(
                    *(index, diloco.round_steps, shard, shards, config.seed),
                    budget_s=budget_s,
                    schedule_step=position if budget_s > 0 else -1,
                )

            synced = of_round(index, len(fragments))
            round_ = FragmentRound(
                Scope(synced, fragments[synced], fragments[of_round(index - 1, len(fragments))]),
                OuterUpdate(outer_step.steps[synced], diloco.outer_warmup_rounds),
                guards[synced],
                index // len(fragments),
                index >= len(fragments) - 1 and not (budget.measuring() or budget.rough),
            )
            outcome = guarded_round(
                shepherd, round_, index, params, delta, assignment, weigh_by(diloco.merge)
            )
            budget.learn(outcome.reported)

            tail = config.steps_per_call
            worker_losses = {
                str(w): float(np.mean(r.losses[-tail:])) for w, r in sorted(outcome.results.items())
            }
            worker_steps = {w: len(r.losses) for w, r in sorted(outcome.results.items())}
            for worker, result in outcome.results.items():
                status.worker_result(
                    worker,
                    worker_losses[str(worker)],
                    worker_steps[worker],
                    worker_steps[worker] * tokens_per_step,
                    result.compute_s,
                    result.waited_s,
                    result.sent_s,
                )
            compute_s = max(r.compute_s for r in outcome.results.values())
            state.tokens += sum(worker_steps.values()) * tokens_per_step
            state.bytes_sent += outcome.bytes_sent
            state.bytes_received += outcome.bytes_received
            state.next_round = index + 1
            # the schedule follows the leading worker: a budgeted round that let the
            # fastest run 1.1 H steps moves the run 1.1 H through its schedule and --steps
            advance = max(worker_steps.values()) if budget_s > 0 else diloco.round_steps
            state.schedule_step = step = position + advance
            record = {
                "round": index,
                "step": step,
                "loss": float(np.mean(list(worker_losses.values()))),
                "worker_losses": worker_losses,
                "worker_steps": {str(w): steps for w, steps in worker_steps.items()},
                "budget_s": round(budget_s, 4),
                "workers": len(outcome.results),
                "attempts": outcome.attempt + 1,
                # accepted results computed before their Assignment reached the worker
                "ahead": sum(result.ahead for result in outcome.results.values()),
                "rejected": {str(w): why for w, why in sorted(outcome.rejected.items())},
                "cosines": {str(w): c for w, c in sorted(outcome.cosines.items())},
                "harms": {str(w): h for w, h in sorted(outcome.harms.items())},
                "costs": {str(w): c for w, c in sorted(outcome.costs.items())},
                "score_s": round(outcome.score_s, 4),
                "spot_checks": outcome.spot_checks,  # results re-run here (--spot-check)
                "spot_check_s": round(outcome.spot_check_s, 4),
                # results the aggregator counted less than in full (0-1)
                "down_weighted": {
                    str(w): round(share, 4)
                    for w, share in sorted(outcome.shares.items())
                    if share < 1
                },
                "tokens": state.tokens,
                "elapsed_s": round(ctx.metrics.elapsed(), 4),
                "bytes_sent": outcome.bytes_sent,
                "bytes_received": outcome.bytes_received,
                "round_s": round(outcome.seconds, 4),
                "compute_s": round(compute_s, 4),
                "communication_s": round(max(outcome.seconds - compute_s, 0.0), 4),
                # the accepted pseudo-gradients on the link and as float32 (--codec)
                "pseudo_gradient_bytes": outcome.delta_bytes,
                "pseudo_gradient_raw_bytes": outcome.delta_raw_bytes,
                "encode_s": round(max(r.encode_s for r in outcome.results.values()), 4),
                "decode_s": round(outcome.decode_s, 4),
            }
            last = not state.goes_on(diloco.round_steps, config.steps)
            evaluate = last or setup.evaluates_after(step, advance)
            if evaluate:
                status.set_state("evaluating", round=index)
                state.val_loss = setup.validation_loss(params)
                record["val_loss"] = state.val_loss
                status.set_state("training", round=index)
            kept = setup.saves_after(step, advance)
            if evaluate or kept or state.next_round % config.shepherd.checkpoint_every == 0:
                # the outer optimizer's state and the copy the workers hold, copied as the
                # parameters are: the next round changes them while this one is written
                extra = {name: array.copy() for name, array in outer_step.state().items()}
                extra |= shepherd.downlink().state()
                extra |= {
                    AGGREGATOR_PREFIX + name: array.copy()
                    for name, array in shepherd.merger.combiner.state().items()
                }
                metadata = state.metadata() | {
                    "accountability": shepherd.merger.accountability.state()
                }
                checkpoints.submit(
                    functools.partial(
                        setup.save_checkpoint,
                        *(ctx.run_dir, [p.copy() for p in params], step),
                        *(extra, metadata, kept),
                    )
                )
            record |= utilisation.round(outcome.results)
            ctx.metrics.write(record)
            ctx.progress.update(
                step, loss=record["loss"], tokens_per_s=state.tokens / ctx.metrics.elapsed()
            )
    checkpoints.wait()  # the last one is written before the summary says whether it was

    wall_time_s = ctx.metrics.elapsed()
    summary = setup.summary(
        record.get("loss", math.nan),
        state.val_loss,
        state.tokens,
        state.tokens / wall_time_s,
        wall_time_s,
    )
    return summary | {
        "rounds": state.next_round,
        "bytes_sent": state.bytes_sent,
        "bytes_received": state.bytes_received,
        "setup_bytes": shepherd.setup_bytes,
        **shepherd.shards_served(),
        "model_bytes": int(sum(p.nbytes for p in params)),
        "aggregator": config.shepherd.aggregator,
        "strikes": dict(shepherd.merger.accountability.strikes),
        "quarantined": dict(shepherd.merger.accountability.quarantined),
        "spot_checks": spot_check_summary(shepherd.spot_checks),
        "shepherd_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        **utilisation.summary(),
    }


AGGREGATOR_PREFIX = "aggregator."  # the aggregator's state in a checkpoint


@dataclass
class Judged:
    """What a checkpoint keeps of the aggregator and of the workers' strikes."""

    aggregator: dict[str, np.ndarray]
    accountability: dict[str, Any]


@dataclass
class RunState:
    """Where the run is: saved with every checkpoint, so `--resume` continues from it."""

    run_id: str  # a worker's saved inner state is only used for the same run id
    next_round: int = 0
    tokens: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    val_loss: float | None = None
    schedule_step: int | None = None  # None: next_round × H (a checkpoint from before)

    def position(self, round_steps: int) -> int:
        """The steps of the run's schedule behind it: H a round, or, in budgeted rounds,
        the steps the leading worker of each round ran."""
        if self.schedule_step is None:
            return self.next_round * round_steps
        return self.schedule_step

    def goes_on(self, round_steps: int, steps: int) -> bool:
        """Whether another round fits in the run's --steps."""
        return self.position(round_steps) + round_steps <= steps

    def metadata(self) -> dict[str, Any]:
        return {"diloco": dataclasses.asdict(self)}


def resume(
    ctx: RunContext, setup: Any, params: list[np.ndarray], outer_step: Any
) -> tuple[RunState, dict[str, np.ndarray], Judged]:
    """Load the last intact checkpoint of the run directory into `params` and the outer
    optimizer; drop the metrics of rounds after it (they are run again). Returns where
    the run is, the copy of the parameters the workers held (`Downlink.load_state`) and
    the aggregator's and the strikes' state."""
    tensors, metadata = checkpoint.load_latest(ctx.run_dir / "checkpoint.safetensors")
    if "diloco" not in metadata:
        raise checkpoint.CheckpointError(
            f"{ctx.run_dir}: the checkpoint is not from a diloco run, it cannot be resumed"
        )
    state = RunState(**json.loads(metadata["diloco"]))
    for name, array in zip(setup.param_names(), params, strict=True):
        array[...] = tensors[name]
    held = {k: v for k, v in tensors.items() if k.startswith(HELD_PREFIX)}
    aggregator = {
        k.removeprefix(AGGREGATOR_PREFIX): v
        for k, v in tensors.items()
        if k.startswith(AGGREGATOR_PREFIX)
    }
    names = set(setup.param_names()) | set(held) | {AGGREGATOR_PREFIX + k for k in aggregator}
    outer_step.load_state({k: v for k, v in tensors.items() if k not in names})
    ctx.metrics.keep_only(lambda record: record.get("round", -1) < state.next_round)
    log.info("resuming", run_dir=str(ctx.run_dir), round=state.next_round)
    judged = Judged(aggregator, json.loads(metadata.get("accountability", "{}")))
    return state, held, judged


def spot_check_summary(checks: SpotChecks | None) -> dict[str, Any] | None:
    """How many results the shepherd re-ran, how many failed, and the seconds it took."""
    if checks is None:
        return None
    seconds = round(checks.seconds, 3)
    return {"checks": checks.checks, "failures": checks.failures, "seconds": seconds}
