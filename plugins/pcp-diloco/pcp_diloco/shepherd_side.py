"""DiLoCo on the shepherd: rounds of (send θ, sum Δ as it arrives, average, outer step)."""

import dataclasses
import math
from typing import Any

import numpy as np
import structlog

from pcp_core import distributed
from pcp_core.algorithms import RunContext
from pcp_core.config import ConfigError, RunConfig
from pcp_core.messages import Assignment
from pcp_core.optimizers import OuterSettings
from pcp_core.training import prepare

log = structlog.get_logger(__name__)


def plan(config: RunConfig) -> tuple[RunConfig, int]:
    """The config with a steps-per-call that divides H, and the number of rounds."""
    if config.steps % config.inner_steps:
        raise ConfigError(
            f"steps ({config.steps}) must be a multiple of inner_steps ({config.inner_steps})"
        )
    steps_per_call = math.gcd(config.steps_per_call, config.inner_steps)
    return dataclasses.replace(config, steps_per_call=steps_per_call), (
        config.steps // config.inner_steps
    )


def run(ctx: RunContext) -> dict[str, Any]:
    config, rounds = plan(ctx.config)
    outer = ctx.plugins.optimizer(config.outer_optimizer)
    if getattr(outer, "role", None) != "outer":
        raise ConfigError(f"optimizer {config.outer_optimizer!r} is not an outer optimizer")
    ctx.plugins.transport(config.transport)  # fail on an unknown transport before compiling
    setup = prepare(config, ctx.plugins)
    params = setup.initial_params()
    outer_step = outer.create(OuterSettings(config.outer_lr, config.outer_momentum), params)
    delta_sum = [np.zeros_like(p) for p in params]
    tokens_per_round = config.inner_steps * setup.tokens_per_step()
    totals = {"tokens": 0, "bytes_sent": 0, "bytes_received": 0}
    val_loss = None

    with distributed.shepherd(ctx, setup, "diloco") as shepherd:
        shepherd.wait_for_workers(config.workers, config.join_timeout)
        ctx.progress.start(config.steps, f"diloco on {config.workers} workers")
        for index in range(rounds):
            shards = max(config.workers, *(i + 1 for i in shepherd.links))

            def assignment(worker: int, index: int = index, shards: int = shards) -> Assignment:
                return Assignment(
                    index, config.inner_steps, (worker + index) % shards, shards, config.seed
                )

            outcome = shepherd.run_round(index, params, delta_sum, assignment)
            if outcome.discarded:
                log.warning("a worker failed mid-result; round discarded", round=index)
            else:
                for total in delta_sum:
                    total *= np.float32(1.0 / len(outcome.results))
                outer_step(params, delta_sum)

            step = (index + 1) * config.inner_steps
            tail = config.steps_per_call
            worker_losses = {
                str(w): float(np.mean(r.losses[-tail:])) for w, r in sorted(outcome.results.items())
            }
            compute_s = max(r.compute_s for r in outcome.results.values())
            totals["tokens"] += tokens_per_round * len(outcome.results)
            totals["bytes_sent"] += outcome.bytes_sent
            totals["bytes_received"] += outcome.bytes_received
            record: dict[str, Any] = {
                "round": index,
                "step": step,
                "loss": float(np.mean(list(worker_losses.values()))),
                "worker_losses": worker_losses,
                "workers": len(outcome.results),
                "tokens": totals["tokens"],
                "elapsed_s": round(ctx.metrics.elapsed(), 4),
                "bytes_sent": outcome.bytes_sent,
                "bytes_received": outcome.bytes_received,
                "round_s": round(outcome.seconds, 4),
                "compute_s": round(compute_s, 4),
                "communication_s": round(max(outcome.seconds - compute_s, 0.0), 4),
                "discarded": outcome.discarded,
            }
            if setup.evaluates_after(step, config.inner_steps):
                val_loss = setup.validation_loss(params)
                record["val_loss"] = val_loss
                setup.save_checkpoint(ctx.run_dir, params, step, extra=outer_step.state())
            ctx.metrics.write(record)
            ctx.progress.update(
                step, loss=record["loss"], tokens_per_s=totals["tokens"] / ctx.metrics.elapsed()
            )

    wall_time_s = ctx.metrics.elapsed()
    summary = setup.summary(
        record["loss"], val_loss, totals["tokens"], totals["tokens"] / wall_time_s, wall_time_s
    )
    return summary | {
        "rounds": rounds,
        "bytes_sent": totals["bytes_sent"],
        "bytes_received": totals["bytes_received"],
        "setup_bytes": shepherd.setup_bytes,
        "model_bytes": int(sum(p.nbytes for p in params)),
    }
