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
    RunStatus,
    Shepherd,
    SpotChecks,
    TrainingSetup,
    Utilisation,
)
from pcp_diloco.checkpoints import RunState


def worker_losses(outcome: RoundOutcome, tail: int) -> dict[str, float]:
    """Each accepted worker's loss in the round: the mean of its last `tail` steps (its
    last call), by worker index as text."""
    return {str(w): float(np.mean(r.losses[-tail:])) for w, r in sorted(outcome.results.items())}


def worker_steps(outcome: RoundOutcome) -> dict[int, int]:
    """The inner steps each accepted worker ran in the round, by worker index."""
    return {w: len(r.losses) for w, r in sorted(outcome.results.items())}


def report_results(
    status: RunStatus,
    outcome: RoundOutcome,
    losses: dict[str, float],
    steps: dict[int, int],
    tokens_per_step: int,
) -> None:
    """Tell the run status what each accepted worker did in the round."""
    for worker, result in outcome.results.items():
        status.worker_result(
            worker,
            losses[str(worker)],
            steps[worker],
            steps[worker] * tokens_per_step,
            result.compute_s,
            result.waited_s,
            result.sent_s,
        )


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
    compute_s = max(r.compute_s for r in outcome.results.values())
    return {
        "round": index,
        "step": step,
        "loss": float(np.mean(list(losses.values()))),
        "worker_losses": losses,
        "worker_steps": {str(w): count for w, count in steps.items()},
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
            str(w): round(share, 4) for w, share in sorted(outcome.shares.items()) if share < 1
        },
        "tokens": tokens,
        "elapsed_s": round(elapsed_s, 4),
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
