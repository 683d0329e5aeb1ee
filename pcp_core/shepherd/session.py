"""The shepherd: the workers it holds, and rounds that survive losing some of them.

Admission (`pcp_core.shepherd.admission`) brings workers in on background threads, and
the shepherd takes them in between rounds (`pcp_core.shepherd.roster`); a round
(`pcp_core.shepherd.rounds`) runs on the workers connected when it starts. This module decides
when a round may run and whether its outcome counts:

- at least `min_workers` accepted results make a round; the average is over those;
- below that, the round is tried again (a new attempt) while enough workers are
  connected, or the shepherd waits for workers to (re)join, up to `join_timeout`;
- a round's deadline is `round_timeout` if set, else three times the median duration of
  the last rounds plus `worker_timeout`; the first round's is set by its first report
  (`pcp_core.shepherd.rounds`).
"""

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from pcp_core.shepherd.aggregation import (
    HeldResults,
    NormBound,
    RunningSum,
    StagingPool,
    step_norm,
)
from pcp_core.shepherd.links import WorkerLink
from pcp_core.shepherd.outcomes import RoundOutcome, RoundPlan
from pcp_core.shepherd.roster import Roster
from pcp_core.shepherd.rounds import DEADLINE_FACTOR, Scope, run_attempt
from pcp_core.shepherd.spot_checks import SpotChecks
from pcp_core.wire.downlink import Downlink
from pcp_core.wire.messages import Assignment, Result

log = structlog.get_logger(__name__)

ATTEMPTS = 3  # attempts in a row that lose no worker yet miss the quorum: the run fails
DEADLINE_HISTORY = 5  # rounds whose duration sets the next deadline


class RoundFailed(RuntimeError):
    """A round could not reach its quorum, though enough workers were connected."""


@dataclass
class Shepherd(Roster):
    """The workers it holds (`Roster`), and the rounds it runs on them."""

    spot_checks: SpotChecks | None = None  # re-runs sampled results (--spot-check)
    _durations: deque[float] = field(default_factory=lambda: deque(maxlen=DEADLINE_HISTORY))
    _bounds: dict[int, NormBound] = field(default_factory=dict)  # by Scope.key
    # the links whose results the last round accepted: they hold the global parameters
    # but for what its outer step changed (Scope.refreshed)
    _current: list[WorkerLink] = field(default_factory=list)
    _staging: StagingPool | None = None
    _sender: Downlink | None = None  # the global parameters as the workers hold them
    _sums: list[np.ndarray] = field(default_factory=list)  # a round's, float64
    _bound_of_last: NormBound = field(default_factory=NormBound)  # the last round's

    @property
    def setup_bytes(self) -> int:
        return self.admission.provisioning.setup_bytes

    def shards_served(self) -> dict[str, Any]:
        """A prepared dataset's shards sent to workers that did not have them: bytes in
        all, and the shard names by worker index."""
        served = self.admission.provisioning
        fetched = {str(i): names for i, names in sorted(served.shards_fetched.items())}
        return {"shard_bytes": served.shard_bytes, "shards_fetched": fetched}

    def downlink(self) -> Downlink:
        """How global parameters go out (`RunSettings.codec_down`), made once; its `state`
        is the copy the workers hold, which a checkpoint keeps."""
        if self._sender is None:
            names = [spec.name for spec in self.admission.setup.program.param_specs]
            codec = self.admission.settings.downlink(self.admission.plugins)
            self._sender = Downlink(names, codec)
        return self._sender

    # -- rounds ---------------------------------------------------------------------------

    def run_round(
        self,
        round_index: int,
        params: list[np.ndarray],
        delta_mean: list[np.ndarray],
        assignment_for: Callable[[int], Assignment],
        excluded: dict[str, str] | None = None,
        first_attempt: int = 0,
        scope: Scope = Scope(),
        weigh: Callable[[Result], int] = lambda result: 1,
    ) -> RoundOutcome:
        """The mean of the accepted pseudo-gradients of a round, into `delta_mean`.

        `assignment_for(worker_index)` gives each worker its assignment (its `attempt` is
        set here); results from the workers named in `excluded` are refused, with the
        reason given there. Returns once at least `min_workers` results were accepted.
        Attempts are numbered from `first_attempt` (a round run again after its outer step
        was rolled back goes on counting, so no earlier result passes for a new one).
        `scope` says which parameters the round sends and gets back (all by default);
        `weigh(result)` how much each accepted result counts in the mean (the same).
        """
        specs = self.admission.setup.program.param_specs
        bound = self._bounds.setdefault(scope.key, NormBound())
        if self._staging is None:
            self._staging = StagingPool(specs)
        if self.merger.aggregator.streams and not self._sums:
            self._sums = [np.zeros(spec.shape, np.float64) for spec in specs]
        attempt, refused_only = first_attempt, 0
        while True:
            self._disconnect_revoked()
            self._wait_for_quorum(round_index)
            links = sorted(self.links.values(), key=lambda link: link.index)
            planning = time.perf_counter()
            plan = self._plan(
                round_index, attempt, links, params, assignment_for, excluded, scope, weigh
            )
            plan_s = time.perf_counter() - planning
            streams = self.merger.aggregator.streams
            total = RunningSum(self._sums) if streams else HeldResults()
            outcome = run_attempt(plan, links, total, self._staging, bound)
            merging = time.perf_counter()
            outcome.plan_s = plan_s
            for link in outcome.lost:
                self._drop(link)
            merged = [delta_mean[i] for i in plan.returned]
            if isinstance(total, HeldResults) and outcome.results:
                self.merger.merge(plan, outcome, total, merged, scope.key, params)
            self._stop_quarantined()
            if len(outcome.results) >= self.limits.min_workers:
                if isinstance(total, RunningSum):
                    total.mean_into(delta_mean)
                self.merger.keep(scope.key, merged)
                outcome.merge_s = time.perf_counter() - merging
                self._durations.append(outcome.report_s)
                bound.remember([step_norm(r) for r in outcome.results.values()])
                self._bound_of_last = bound
                self._current = [link for link in links if link.index in outcome.results]
                return outcome
            refused_only = self._below_quorum(round_index, attempt, outcome, refused_only)
            attempt += 1

    def _plan(
        self,
        round_index: int,
        attempt: int,
        links: list[WorkerLink],
        params: list[np.ndarray],
        assignment_for: Callable[[int], Assignment],
        excluded: dict[str, str] | None,
        scope: Scope,
        weigh: Callable[[Result], int],
    ) -> RoundPlan:
        """An attempt's plan (`run_round` says what its arguments mean): each worker's
        Assignment (its `attempt` set), the parameters as sent, which workers hold the
        last ones, the deadline, and whose results are refused."""
        everything = tuple(range(len(self.admission.setup.program.param_specs)))
        assignments, changed = {}, set()
        refreshed = everything if scope.refreshed is None else scope.refreshed
        for link in links:
            assignments[link.index] = assignment_for(link.index)
            assignments[link.index].attempt = attempt
            if attempt == 0 and any(link is held for held in self._current):
                changed.add(link.index)
        self._current = []
        return RoundPlan(
            round_index,
            attempt,
            self.downlink().outgoing(params, refreshed),
            assignments,
            changed,
            everything if scope.returned is None else scope.returned,
            self._deadline(max(a.budget_s for a in assignments.values())),
            self.limits.worker_timeout_s,
            self.admission.status,
            excluded={**(excluded or {}), **self._quarantine_reasons()},
            codec=self.admission.settings.uplink(self.admission.plugins),
            weigh=weigh,
            pushed=self.admission.settings.pushes,
            accountability=self.merger.accountability,
            spot_checks=self.spot_checks,
        )

    def _below_quorum(
        self, round_index: int, attempt: int, outcome: RoundOutcome, refused_only: int
    ) -> int:
        """An attempt missed the quorum: FloatingPointError where every result was NaN or
        Inf, RoundFailed where ATTEMPTS in a row lost no worker; else how many in a row
        have lost none."""
        every_one_non_finite = outcome.non_finite and outcome.non_finite == set(outcome.rejected)
        if not outcome.results and every_one_non_finite:
            raise FloatingPointError(
                f"round {round_index}: every result was NaN or Inf, the run diverged; lower --lr"
            )
        refused_only = 0 if outcome.lost else refused_only + 1
        if refused_only >= ATTEMPTS:
            raise RoundFailed(
                f"round {round_index}: {ATTEMPTS} attempts in a row ended with fewer than "
                f"--min-workers {self.limits.min_workers} accepted results "
                f"(refused: {outcome.rejected or 'none'})"
            )
        log.warning(
            "round below quorum; "
            + (
                "trying it again"
                if len(self.links) >= self.limits.min_workers
                else "waiting for workers, then trying it again"
            ),
            round=round_index,
            attempt=attempt,
            accepted=len(outcome.results),
            min_workers=self.limits.min_workers,
            connected=len(self.links),
        )
        return refused_only

    def _quarantine_reasons(self) -> dict[str, str]:
        quarantined = self.merger.accountability.quarantined
        return {name: f"quarantined: {why}" for name, why in quarantined.items()}

    def rolled_back(self) -> None:
        """The last round's outer step was undone: its norms are no reference for later
        rounds' (they may hold the very outlier that caused it), the aggregator goes back
        to its state before it, and no worker holds the global parameters the round is
        run again from."""
        self._bound_of_last.forget_last()
        self.merger.undo()
        self._current = []

    def _deadline(self, budget_s: float) -> float | None:
        """--round-timeout where given; else DEADLINE_FACTOR times the typical round (or
        the round's time budget, where that is longer: a budget can grow from one round
        to the next) plus the worker timeout; None before any round, see rounds.py."""
        if self.limits.round_timeout_s is not None:
            return self.limits.round_timeout_s
        if not self._durations:
            return None
        typical = max(statistics.median(self._durations), budget_s)
        return DEADLINE_FACTOR * typical + self.limits.worker_timeout_s
