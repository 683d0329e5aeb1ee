"""A round's merge of the results held for it: each scored, the ones that fail left out
and named, the rest combined by the run's aggregator (`pcp_core.aggregators`).

The shepherd's session (`pcp_core.shepherd.session`) hands over each round's held results
(`HeldResults`); what the scores mean and when a worker is quarantined is
`pcp_core.shepherd.accountability`'s. The aggregator's state moves only when a round is
kept (`keep`), and goes back when its outer step is rolled back (`undo`).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import structlog

from pcp_core.aggregators import MEAN, Aggregator, Combiner
from pcp_core.shepherd.accountability import (
    FULL_GAIN,
    Accountability,
    Score,
    cosines,
    counted_share,
    gains,
)
from pcp_core.shepherd.aggregation import HeldResults
from pcp_core.shepherd.rounds import RoundOutcome, RoundPlan

log = structlog.get_logger(__name__)


@dataclass
class Merger:
    aggregator: Aggregator = MEAN
    accountability: Accountability = field(default_factory=Accountability)
    # the loss results are scored by (TrainingSetup.scoring_loss); None: not scored
    scorer: Callable[[list[np.ndarray], int], float] | None = None
    revoked: set[str] = field(default_factory=set)  # names revoked while connected
    _combiner: Combiner | None = None
    _before: dict[str, np.ndarray] = field(default_factory=dict)  # its state before the last

    @property
    def combiner(self) -> Combiner:
        """The run's aggregator (`--aggregator`), made once; its state is checkpointed."""
        if self._combiner is None:
            self._combiner = self.aggregator.create()
        return self._combiner

    def keep(self, key: int, merged: list[np.ndarray]) -> None:
        """The round of `key` is kept with `merged`: the aggregator may remember it."""
        self._before = {name: array.copy() for name, array in self.combiner.state().items()}
        self.combiner.accept(key, merged)

    def undo(self) -> None:
        """The last kept round's outer step was rolled back: the state from before it."""
        self.combiner.load_state(self._before)

    def merge(
        self,
        plan: RoundPlan,
        outcome: RoundOutcome,
        held: HeldResults,
        merged: list[np.ndarray],
        key: int,
        params: list[np.ndarray],
    ) -> None:
        """Score the held results (`pcp_core.shepherd.accountability`) and combine the
        ones not struck into `merged`: first by the loss of the model each makes (a
        small gain counts for less), then by its cosine with the merge (combined again
        without the ones that fail)."""
        for worker in [w for w in outcome.results if outcome.senders[w] in self.revoked]:
            leave_out(plan, outcome, worker, "its credential was revoked during the round")
        counted = {w: 1.0 for w in outcome.results}
        if self.scorer is not None and outcome.results:
            started = time.perf_counter()
            counted = self._score_gains(plan, outcome, held, params)
            outcome.score_s = time.perf_counter() - started
        for attempt in range(2):
            order = sorted(outcome.results)
            if not order:
                return
            deltas = [held.deltas[w] for w in order]
            weights = [held.weights[w] * counted[w] for w in order]
            shares = self.combiner.combine(key, deltas, weights, merged)
            if attempt:
                break
            found = cosines(deltas, merged)
            outcome.cosines = {w: round(c, 4) for w, c in zip(order, found, strict=True)}
            names = [outcome.senders[w] for w in order]
            scores = [Score(cosine=c) for c in found]
            struck = self.accountability.judge(plan.round, names, scores)
            for worker, name in zip(order, names, strict=True):
                if name in struck:
                    leave_out(plan, outcome, worker, struck[name])
            if not struck:
                break
        for worker, share in zip(order, shares or [1.0] * len(order), strict=True):
            self._down_weighted(plan, outcome, worker, counted[worker] * share)

    def _down_weighted(
        self, plan: RoundPlan, outcome: RoundOutcome, worker: int, share: float
    ) -> None:
        """Record, and log, a result that counted for less than its weight."""
        if share >= 1.0:
            return
        outcome.shares[worker] = share
        gain = outcome.gains.get(worker)
        why = (
            f"its model gains {gain:.3g}x the round's loss gain"
            if gain is not None and gain < FULL_GAIN
            else f"far from the others ({self.aggregator.name})"
        )
        log.warning(
            "result down-weighted",
            worker=outcome.senders[worker],
            round=plan.round,
            counted=round(share, 3),
            reason=f"{why}: counted at {share:.0%}",
        )

    def _score_gains(
        self, plan: RoundPlan, outcome: RoundOutcome, held: HeldResults, params: list[np.ndarray]
    ) -> dict[int, float]:
        """Leave out the results whose model does not lower the scoring loss (`gains`),
        striking those that make it clearly worse; the share of its weight each result
        counts for (a gain under FULL_GAIN in proportion)."""
        assert self.scorer is not None
        order = sorted(outcome.results)
        base = self.scorer(params, plan.round)
        trial, improvements = list(params), []
        for worker in order:
            for delta, index in zip(held.deltas[worker], plan.returned, strict=True):
                trial[index] = params[index] - delta
            improvements.append(base - self.scorer(trial, plan.round))
        steps = [len(outcome.results[w].losses) for w in order]
        found = gains(improvements, steps)
        outcome.gains = {w: round(g, 4) for w, g in zip(order, found, strict=True)}
        names = [outcome.senders[w] for w in order]
        struck = self.accountability.judge(plan.round, names, [Score(gain=g) for g in found])
        shares = {w: counted_share(g) for w, g in zip(order, found, strict=True)}
        for worker, name, gain in zip(order, names, found, strict=True):
            if name in struck:
                leave_out(plan, outcome, worker, struck[name])
            elif shares[worker] == 0:
                why = f"the model it makes gains {gain:.3g}x the round's loss gain: nothing"
                leave_out(plan, outcome, worker, why)
        return shares


def leave_out(plan: RoundPlan, outcome: RoundOutcome, worker: int, why: str) -> None:
    """A fetched result that does not count: logged, its losses not the run's."""
    name = outcome.senders[worker]
    log.warning("result left out", worker=f"worker {worker} ({name})", round=plan.round, reason=why)
    outcome.rejected[worker] = why
    del outcome.results[worker], outcome.senders[worker]
