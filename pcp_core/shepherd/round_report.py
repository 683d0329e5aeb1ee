"""What every distributed algorithm reports of a round it ran with `Shepherd.run_round`:
each accepted worker's share to the run status (the dashboard, `/status`), and the
fields of the round's metrics record that the outcome alone gives (what the aggregator
made of each result, the bytes each way, where the time went). An algorithm adds its own
fields (its round and step, losses, evaluations) to the record."""

from typing import Any

import numpy as np

from pcp_core.shepherd.outcomes import RoundOutcome
from pcp_core.watch.run_status import RunStatus


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


def outcome_record(outcome: RoundOutcome) -> dict[str, Any]:
    """The round's record fields that its outcome gives: who took part and what the
    aggregator made of each result, the bytes each way, the round's seconds and the
    slowest worker's compute (the rest is communication), encoding and decoding."""
    compute_s = max(r.compute_s for r in outcome.results.values())
    return {
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
        "plan_s": round(outcome.plan_s, 4),  # the shepherd's: the downlink's encoding
        "merge_s": round(outcome.merge_s, 4),
    }
