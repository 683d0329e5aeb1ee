"""Federated averaging's shepherd side: its rounds (a worker's round is the engine's
`steps_from_global`)."""

import uuid
from typing import Any

import numpy as np

from pcp_core.engine import (
    Assignment,
    ConfigError,
    RunContext,
    RunSettings,
    Utilisation,
    prepare,
    shepherd,
)
from pcp_fedavg import FedAvgSettings


def run(ctx: RunContext) -> dict[str, Any]:
    """Round after round: each worker trains from the global parameters, and the global
    parameters move by the mean of the accepted changes. The run's summary."""
    config = ctx.config
    settings: FedAvgSettings = config.settings("fedavg")
    steps = settings.average_every
    if steps % config.steps_per_call:
        raise ConfigError(f"fedavg.average_every ({steps}) must be a multiple of "
                          f"--steps-per-call ({config.steps_per_call})")  # fmt: skip
    workers = config.shepherd.workers
    trainers = config.local_worker_backends() if ctx.local_workers else []
    setup = prepare(config, ctx.plugins, trainers=trainers, shepherd=True)
    params = setup.initial_params()
    change = [np.zeros_like(p) for p in params]  # each round's merged change (run_round)
    told = RunSettings(algorithm="fedavg", run_id=uuid.uuid4().hex, inner_states_kept=2)
    rounds = max(1, config.steps // steps)
    ctx.status.describe(rounds=rounds, model=config.model, parameters=setup.program.parameter_count)
    loss, val_loss, tokens = float("nan"), float("nan"), 0
    with shepherd(ctx, setup, told) as herd:
        herd.wait_for_workers(workers, config.shepherd.join_timeout)
        utilisation = Utilisation(workers)
        ctx.progress.start(rounds * steps, f"fedavg on {workers} workers")
        for index in range(rounds):

            def assignment(worker: int, index: int = index) -> Assignment:
                return Assignment(index, steps, (worker + index) % workers, workers, config.seed)

            outcome = herd.run_round(index, params, change, assignment)
            for param, moved in zip(params, change, strict=True):
                param -= moved  # the global model becomes the workers' mean
            results = list(outcome.results.values())
            loss = float(np.mean([np.mean(r.losses[-config.steps_per_call :]) for r in results]))
            tokens += sum(len(r.losses) for r in results) * setup.tokens_per_step()
            record: dict[str, Any] = {"round": index, "step": (index + 1) * steps, "loss": loss}
            if index == rounds - 1 or setup.evaluates_after((index + 1) * steps, steps):
                val_loss = record["val_loss"] = setup.validation_loss(params)
            ctx.metrics.write(record | utilisation.round(outcome.results))
            ctx.progress.update((index + 1) * steps, loss=loss)
    setup.save_checkpoint(ctx.run_dir, params, rounds * steps)  # what `pcp sample` reads
    wall_time_s = ctx.metrics.elapsed()
    return setup.summary(loss, val_loss, tokens, tokens / wall_time_s, wall_time_s)
