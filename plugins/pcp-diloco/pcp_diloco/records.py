"""What a DiLoCo run reports: each round's accepted results to the run status, each
round's record (a line of metrics.jsonl, behind the dashboard, `/status` and
loss.png), and the run's summary (summary.json)."""

import math
import resource
from typing import Any

import numpy as np

from pcp_core.engine import (
    RoundOutcome,
    RunConfig,
    Shepherd,
    SpotChecks,
    TrainingSetup,
    Utilisation,
    outcome_record,
)
from pcp_diloco.checkpoints import RunState


def round_record(
    index: int,
    outcome: RoundOutcome,
    step: int,
    budget_s: float,
    losses: dict[str, float],
    steps: dict[int, int],
    tokens: int,
    elapsed_s: float,
) -> dict[str, Any]:
    """The metrics record of round `index`, which took the run's schedule to `step`: its
    losses, what the aggregator made of each result, its bytes and seconds."""
    return {
        "round": index,
        "step": step,
        "loss": float(np.mean(list(losses.values()))),
        "worker_losses": losses,
        "worker_steps": {str(w): count for w, count in steps.items()},
        "budget_s": round(budget_s, 4),
        "tokens": tokens,
        "elapsed_s": round(elapsed_s, 4),
    } | outcome_record(outcome)


def run_summary(
    config: RunConfig,
    setup: TrainingSetup,
    shepherd: Shepherd,
    state: RunState,
    last: dict[str, Any],
    params: list[np.ndarray],
    utilisation: Utilisation,
    wall_time_s: float,
) -> dict[str, Any]:
    """The run's summary: the setup's (losses, tokens, throughput) with the rounds, the
    bytes each way, what the aggregator refused and whom it quarantined, the spot checks
    and the workers' utilisation. `last` is the last round's record."""
    summary = setup.summary(
        last.get("loss", math.nan),
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


def spot_check_summary(checks: SpotChecks | None) -> dict[str, Any] | None:
    """How many results the shepherd re-ran, how many failed, and the seconds it took."""
    if checks is None:
        return None
    seconds = round(checks.seconds, 3)
    return {"checks": checks.checks, "failures": checks.failures, "seconds": seconds}
