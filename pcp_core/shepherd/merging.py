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
    Accountability,
    Replays,
    Score,
    cosines,
    cost,
    harm,
)
from pcp_core.shepherd.aggregation import HeldResults
from pcp_core.shepherd.outcomes import RoundOutcome, RoundPlan

log = structlog.get_logger(__name__)


@dataclass
class Merger:
    aggregator: Aggregator = MEAN
    accountability: Accountability = field(default_factory=Accountability)
    # each batch's loss results are scored by (TrainingSetup.scoring_losses); None: none
    scorer: Callable[[list[np.ndarray], int], np.ndarray] | None = None
    revoked: set[str] = field(default_factory=set)  # names revoked while connected
    replays: Replays = field(default_factory=Replays)
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
        """Combine the held results into `merged`, score each against the merge
        (`pcp_core.shepherd.accountability`: what leaving it out does to the loss, its
        cosine), and combine again without the ones left out."""
        for worker in [w for w in outcome.results if outcome.senders[w] in self.revoked]:
            leave_out(plan, outcome, worker, "its credential was revoked during the round")
        for worker in sorted(outcome.results):
            name = outcome.senders[worker]
            cosine = self.replays.replayed(name, key, plan.round, held.deltas[worker])
            if cosine is not None:
                problem = f"the result it sent the round before again (cosine {cosine:.4f})"
                leave_out(
                    plan, outcome, worker, self.accountability.strike(plan.round, name, problem)
                )
        shares = self._combine(held, merged, key, outcome)
        # of two results, either may be the worse by chance: no telling which is wrong
        if self.scorer is not None and len(outcome.results) > 2:
            started = time.perf_counter()
            self._score_losses(plan, outcome, held, merged, params, key)
            outcome.score_s = time.perf_counter() - started
            shares = self._combine(held, merged, key, outcome)
        order = sorted(outcome.results)
        # with two results, one against the other, there is no telling which is wrong
        total = sum(held.weights[w] * shares.get(w, 1.0) for w in order)
        counted = [held.weights[w] * shares.get(w, 1.0) / total for w in order]
        found = cosines([held.deltas[w] for w in order], merged, counted) if len(order) > 2 else []
        order = order if found else []
        outcome.cosines = {w: round(c, 4) for w, c in zip(order, found, strict=True)}
        names = [outcome.senders[w] for w in order]
        struck = self.accountability.judge(plan.round, names, [Score(cosine=c) for c in found])
        for worker, name in zip(order, names, strict=True):
            if name in struck:
                leave_out(plan, outcome, worker, struck[name])
        if struck:
            shares = self._combine(held, merged, key, outcome)
        for worker, share in shares.items():
            if share < 1.0:
                outcome.shares[worker] = share
                log.warning(
                    "result down-weighted",
                    worker=f"worker {worker} ({outcome.senders[worker]})",
                    round=plan.round,
                    counted=round(share, 3),
                    reason=f"far from the others ({self.aggregator.name}): counted at {share:.0%}",
                )

    def _combine(
        self, held: HeldResults, merged: list[np.ndarray], key: int, outcome: RoundOutcome
    ) -> dict[int, float]:
        """Combine the results still in the round into `merged`; how much each counted."""
        order = sorted(outcome.results)
        if not order:
            return {}
        deltas, weights = [held.deltas[w] for w in order], [held.weights[w] for w in order]
        shares = self.combiner.combine(key, deltas, weights, merged)
        return dict(zip(order, shares or [1.0] * len(order), strict=True))

    def _score_losses(
        self,
        plan: RoundPlan,
        outcome: RoundOutcome,
        held: HeldResults,
        merged: list[np.ndarray],
        params: list[np.ndarray],
        key: int,
    ) -> None:
        """Leave out the results without which the merge's model has a lower loss, beyond
        doubt (`harm`) and by a share of the round's gain that matters (`cost`),
        striking those whose share of the merge makes it far worse.

        The merge without a result is the aggregator's of the others (one more merge a
        result: the aggregator changes no state in `combine`)."""
        assert self.scorer is not None
        returned = plan.returned
        before = self.scorer(params, plan.round)
        trial = list(params)
        for array, index in zip(merged, returned, strict=True):
            trial[index] = params[index] - array
        with_all = self.scorer(trial, plan.round)
        order = sorted(outcome.results)
        others = [np.empty_like(array) for array in merged]
        for worker in order:
            rest = [w for w in order if w != worker]
            deltas, weights = [held.deltas[w] for w in rest], [held.weights[w] for w in rest]
            self.combiner.combine(key, deltas, weights, others)
            for array, index in zip(others, returned, strict=True):
                trial[index] = params[index] - array
            without = self.scorer(trial, plan.round)
            score = Score(harm=harm(without, with_all), cost=cost(before, with_all, without))
            outcome.harms[worker] = round(score.harm, 3)
            outcome.costs[worker] = round(score.cost, 4)
            name = outcome.senders[worker]
            struck = self.accountability.judge(plan.round, [name], [score])
            if name in struck:
                leave_out(plan, outcome, worker, struck[name])
            elif why := score.left_out(self.accountability.policy):
                leave_out(plan, outcome, worker, why)


def leave_out(plan: RoundPlan, outcome: RoundOutcome, worker: int, why: str) -> None:
    """A fetched result that does not count: logged, its losses not the run's."""
    name = outcome.senders[worker]
    log.warning("result left out", worker=f"worker {worker} ({name})", round=plan.round, reason=why)
    outcome.rejected[worker] = why
    del outcome.results[worker], outcome.senders[worker]
