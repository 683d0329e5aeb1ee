"""DiLoCo on the shepherd: rounds of (send θ, sum the accepted Δ, average, outer step),
checkpointed every --checkpoint-every rounds so `--resume` can continue the run. A
checkpoint is written on a thread of its own from a copy, while the next round runs: a
model of 500 MB takes seconds to write, which the workers would otherwise wait for.

`run` takes its steps in turn: the plan (`pcp_diloco.planning`) and the program
(`prepared`), the state the rounds work on, new or resumed (`start_rounds`), the
workers joining (`joined`), then round after round (`one_round`: run it, count it in,
evaluate and checkpoint after it where due, record it: `pcp_diloco.records`), and the
run's summary."""

import dataclasses
import functools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from pcp_core.engine import (
    Assignment,
    ConfigError,
    OneInFlight,
    OuterSettings,
    RunConfig,
    RunContext,
    Scope,
    Shepherd,
    StepGuard,
    TrainingSetup,
    Utilisation,
    prepare,
    report_results,
    worker_losses,
    worker_steps,
)
from pcp_core.engine import shepherd as open_shepherd
from pcp_diloco import records
from pcp_diloco.budgets import RoundBudget, weigh_by
from pcp_diloco.checkpoints import Judged, RunState, resume, saved_state
from pcp_diloco.fragments import of_round
from pcp_diloco.outer_steps import (
    FragmentRound,
    FragmentSteps,
    OuterUpdate,
    guarded_round,
    split_fragments,
)
from pcp_diloco.planning import plan, run_settings
from pcp_diloco.settings import DilocoSettings

log = structlog.get_logger(__name__)


def run(ctx: RunContext) -> dict[str, Any]:
    """Train with DiLoCo on the workers that join, round after round; the summary."""
    config, planned_rounds = plan(ctx.config, ctx.plugins)
    setup, outer = prepared(ctx, config, planned_rounds)
    rounds, held, judged = start_rounds(ctx, config, setup, outer)
    settings = run_settings(config, ctx.plugins, setup.program, rounds.state.run_id)
    diloco = rounds.diloco
    # budgeted rounds end when the leading worker's steps reach --steps: no count ahead
    planned = planned_rounds if diloco.round_budget == "steps" else None
    parameters = setup.program.parameter_count
    ctx.status.describe(rounds=planned, model=config.model, parameters=parameters)
    record: dict[str, Any] = {}
    with open_shepherd(ctx, setup, settings) as shepherd:
        utilisation = joined(ctx, config, shepherd, held, judged)
        while rounds.state.goes_on(diloco.round_steps, config.steps):
            record = one_round(ctx, rounds, shepherd, utilisation)
    rounds.checkpoints.wait()  # the last one is written before the summary says whether it was
    wall_time_s = ctx.metrics.elapsed()
    return records.run_summary(
        config, setup, shepherd, rounds.state, record, rounds.params, utilisation, wall_time_s
    )


def prepared(ctx: RunContext, config: RunConfig, rounds: int) -> tuple[TrainingSetup, Any]:
    """The program the workers run and the outer optimizer, once the plugins the run
    names are known to be there; then logs what `plan` chose."""
    diloco: DilocoSettings = config.settings("diloco")
    outer = ctx.plugins.optimizer(diloco.outer_optimizer)
    if getattr(outer, "role", None) != "outer":
        raise ConfigError(f"optimizer {diloco.outer_optimizer!r} is not an outer optimizer")
    # fail on an unknown transport or aggregator before compiling
    ctx.plugins.transport(config.shepherd.transport)
    ctx.plugins.aggregator(config.shepherd.aggregator)
    trainers = config.local_worker_backends() if ctx.local_workers else []
    setup = prepare(config, ctx.plugins, trainers=trainers, shepherd=True)
    log_plan(ctx.config, config, rounds)
    return setup, outer


def log_plan(given: RunConfig, config: RunConfig, rounds: int) -> None:
    """Say what `plan` made of the `given` config: the rounds, and the workers' inner
    learning rate and optimizer settings where it changed them."""
    diloco: DilocoSettings = config.settings("diloco")
    # said once the settings are known good: a bad one is a one-line error
    log.info("rounds", workers=config.shepherd.workers, rounds=rounds,
             inner_steps=diloco.inner_steps, outer_momentum=diloco.outer_momentum)  # fmt: skip
    if (config.lr, config.warmup_steps) != (given.lr, given.warmup_steps):
        log.info("inner learning rate", lr=config.lr, min_lr=config.min_lr, of_lr=given.lr,
                 workers=config.shepherd.workers, warmup_steps=config.warmup_steps)  # fmt: skip
    own = config.plugins.get(config.optimizer)
    if own is not None and own != given.plugins.get(config.optimizer):  # `plan` changed it
        log.info("inner optimizer", optimizer=config.optimizer, **dataclasses.asdict(own))


@dataclass
class Rounds:
    """What a run's rounds work on: the global parameters, split into fragments that each
    have an outer optimizer and a step guard, the mean of a round's pseudo-gradients,
    the round budget, where the run is, and the checkpoint being written."""

    config: RunConfig  # as planned (`pcp_diloco.planning.plan`)
    diloco: DilocoSettings
    setup: TrainingSetup
    params: list[np.ndarray]
    fragments: list[tuple[int, ...]]
    outer_step: FragmentSteps
    delta: list[np.ndarray]  # the mean of a round's pseudo-gradients
    guards: list[StepGuard]
    tokens_per_step: int
    budget: RoundBudget
    state: RunState
    checkpoints: OneInFlight = field(default_factory=lambda: OneInFlight("checkpoint"))


def start_rounds(
    ctx: RunContext, config: RunConfig, setup: TrainingSetup, outer: Any
) -> tuple[Rounds, dict[str, np.ndarray], Judged]:
    """The state the rounds start from: the initial parameters of a new run, or under
    --resume the last checkpoint's, with the copy of them its workers held and the
    aggregator's and the strikes' state (`pcp_diloco.checkpoints.resume`)."""
    diloco: DilocoSettings = config.settings("diloco")
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
    rounds = Rounds(
        *(config, diloco, setup, params, fragments, outer_step),
        delta=[np.zeros_like(p) for p in params],
        guards=[StepGuard([params[i] for i in indices]) for indices in fragments],
        tokens_per_step=setup.tokens_per_step(),
        budget=RoundBudget(diloco.round_budget, diloco.round_steps, config.steps_per_call),
        state=state,
    )
    return rounds, held, judged


def joined(
    ctx: RunContext,
    config: RunConfig,
    shepherd: Shepherd,
    held: dict[str, np.ndarray],
    judged: Judged,
) -> Utilisation:
    """Wait for the workers, the shepherd holding what a resumed run had (the copy of the
    parameters its workers held, the aggregator's and the strikes' state); the workers'
    utilisation counts from then."""
    ctx.status.set_state("waiting for workers", workers=config.shepherd.workers)
    shepherd.downlink().load_state(held)  # a resumed run's workers: the copy they held
    shepherd.merger.combiner.load_state(judged.aggregator)
    shepherd.merger.accountability.load_state(judged.accountability)
    shepherd.wait_for_workers(config.shepherd.workers, config.shepherd.join_timeout)
    utilisation = Utilisation(config.shepherd.workers)
    ctx.progress.start(config.steps, f"diloco on {config.shepherd.workers} workers")
    return utilisation


def one_round(
    ctx: RunContext, rounds: Rounds, shepherd: Shepherd, utilisation: Utilisation
) -> dict[str, Any]:
    """Run the next round and count it in, evaluate and checkpoint after it where due,
    and write its record (returned)."""
    config, diloco, state = rounds.config, rounds.diloco, rounds.state
    index, position = state.next_round, state.position(diloco.round_steps)
    shards = max(config.shepherd.workers, *(i + 1 for i in shepherd.links))
    budget_s = rounds.budget.seconds()
    assignment = assignments(config, index, shards, budget_s, position)
    round_ = fragment_round(rounds, index)
    started = time.perf_counter()
    outcome = guarded_round(
        shepherd, round_, index, rounds.params, rounds.delta, assignment, weigh_by(diloco.merge)
    )
    outer_s = time.perf_counter() - started - outcome.seconds - outcome.plan_s - outcome.merge_s
    rounds.budget.learn(outcome.reported)

    losses = worker_losses(outcome, config.steps_per_call)
    steps = worker_steps(outcome)
    report_results(ctx.status, outcome, losses, steps, rounds.tokens_per_step)
    state.tokens += sum(steps.values()) * rounds.tokens_per_step
    state.bytes_sent += outcome.bytes_sent
    state.bytes_received += outcome.bytes_received
    state.next_round = index + 1
    # the schedule follows the leading worker: a budgeted round that let the
    # fastest run 1.1 H steps moves the run 1.1 H through its schedule and --steps
    advance = max(steps.values()) if budget_s > 0 else diloco.round_steps
    state.schedule_step = step = position + advance
    elapsed_s = ctx.metrics.elapsed()
    record = records.round_record(
        index, outcome, step, budget_s, losses, steps, state.tokens, elapsed_s
    )
    started = time.perf_counter()
    evaluated = evaluate_after(ctx, rounds, index, step, advance, record)
    evaluate_s, started = time.perf_counter() - started, time.perf_counter()
    kept = rounds.setup.saves_after(step, advance)
    if evaluated or kept or state.next_round % config.shepherd.checkpoint_every == 0:
        checkpoint(ctx, rounds, shepherd, step, kept)
    record |= {  # the shepherd's own work between the workers' rounds
        "outer_s": round(outer_s, 4),  # the outer step, its guard (and attempts undone)
        "evaluate_s": round(evaluate_s, 4),
        "checkpoint_s": round(time.perf_counter() - started, 4),  # its copies (written aside)
    }
    record |= utilisation.round(outcome.results)
    ctx.metrics.write(record)
    tokens_per_s = state.tokens / ctx.metrics.elapsed()
    ctx.progress.update(step, loss=record["loss"], tokens_per_s=tokens_per_s)
    return record


def assignments(
    config: RunConfig, index: int, shards: int, budget_s: float, position: int
) -> Callable[[int], Assignment]:
    """Each worker's Assignment of round `index`: its shard of the data, and in budgeted
    rounds the round's seconds and where the run's schedule stands."""
    diloco: DilocoSettings = config.settings("diloco")

    def assignment(worker: int) -> Assignment:
        shard = (worker + index) % shards
        return Assignment(
            *(index, diloco.round_steps, shard, shards, config.seed),
            budget_s=budget_s,
            schedule_step=position if budget_s > 0 else -1,
        )

    return assignment


def fragment_round(rounds: Rounds, index: int) -> FragmentRound:
    """What round `index` synchronises (one fragment, or the whole model) and how."""
    fragments, budget = rounds.fragments, rounds.budget
    synced = of_round(index, len(fragments))
    return FragmentRound(
        Scope(synced, fragments[synced], fragments[of_round(index - 1, len(fragments))]),
        OuterUpdate(rounds.outer_step.steps[synced], rounds.diloco.outer_warmup_rounds),
        rounds.guards[synced],
        index // len(fragments),
        index >= len(fragments) - 1 and not (budget.measuring() or budget.rough),
    )


def evaluate_after(
    ctx: RunContext, rounds: Rounds, index: int, step: int, advance: int, record: dict[str, Any]
) -> bool:
    """Whether round `index`, which took the schedule `advance` steps to `step`, is
    evaluated (the run's last, and each past a multiple of --eval-every); if so, the
    validation loss goes into the run's state and the round's `record`."""
    state = rounds.state
    last = not state.goes_on(rounds.diloco.round_steps, rounds.config.steps)
    evaluate = last or rounds.setup.evaluates_after(step, advance)
    if evaluate:
        ctx.status.set_state("evaluating", round=index)
        state.val_loss = rounds.setup.validation_loss(rounds.params)
        record["val_loss"] = state.val_loss
        ctx.status.set_state("training", round=index)
    return evaluate


def checkpoint(ctx: RunContext, rounds: Rounds, shepherd: Shepherd, step: int, kept: bool) -> None:
    """Write the checkpoint after the round that ended at `step` (`kept` under
    --save-every) on the checkpoint thread, from copies: the next round changes the
    parameters and the outer state while it is written."""
    extra, metadata = saved_state(rounds.outer_step, shepherd, rounds.state)
    rounds.checkpoints.submit(
        functools.partial(
            rounds.setup.save_checkpoint,
            *(ctx.run_dir, [p.copy() for p in rounds.params], step),
            *(extra, metadata, kept),
        )
    )
