"""The shepherd: the workers it holds, and rounds that survive losing some of them.

Admission (`pcp_core.shepherd.admission`) brings workers in on background threads; a round
(`pcp_core.shepherd.rounds`) runs on the workers connected when it starts. This module decides
when a round may run and whether its outcome counts:

- at least `min_workers` accepted results make a round; the average is over those;
- below that, the round is tried again (a new attempt) while enough workers are
  connected, or the shepherd waits for workers to (re)join, up to `join_timeout`;
- a round's deadline is `round_timeout` if set, else three times the median duration of
  the last rounds plus `worker_timeout`; the first round's is set by its first report
  (`pcp_core.shepherd.rounds`).
"""

import contextlib
import queue
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from pcp_core.codecs import on_the_wire
from pcp_core.shepherd.admission import Admission, WorkerLink
from pcp_core.shepherd.aggregation import (
    HeldResults,
    NormBound,
    RunningSum,
    StagingPool,
    step_norm,
)
from pcp_core.shepherd.merging import Merger
from pcp_core.shepherd.rounds import (
    DEADLINE_FACTOR,
    RoundOutcome,
    RoundPlan,
    Scope,
    run_attempt,
)
from pcp_core.shepherd.spot_checks import SpotChecks
from pcp_core.wire.downlink import Downlink
from pcp_core.wire.messages import Assignment, Result, Stop
from pcp_core.wire.transport import TransportError

log = structlog.get_logger(__name__)

ATTEMPTS = 3  # attempts in a row that lose no worker yet miss the quorum: the run fails
DEADLINE_HISTORY = 5  # rounds whose duration sets the next deadline
STOP_DRAIN_S = 5.0  # how long stopped workers have to close their ends
REVOCATION_POLL_S = 1.0  # how often the revocation list is looked at during a run


class RoundFailed(RuntimeError):
    """A round could not reach its quorum, though enough workers were connected."""


class NotEnoughWorkers(RuntimeError):
    """Too few workers joined in time, and no more are coming."""


@dataclass
class Limits:
    """How long to wait for whom, and how many results make a round."""

    min_workers: int = 1
    worker_timeout_s: float = 30.0
    round_timeout_s: float | None = None  # None: derived from earlier rounds
    join_timeout_s: float | None = 600.0


@dataclass
class Shepherd:
    admission: Admission
    limits: Limits = field(default_factory=Limits)
    merger: Merger = field(default_factory=Merger)  # scores and combines held results
    spot_checks: SpotChecks | None = None  # re-runs sampled results (--spot-check)
    links: dict[int, WorkerLink] = field(default_factory=dict)
    still_coming: Callable[[], bool] = lambda: True  # may more workers still join?
    _durations: deque[float] = field(default_factory=lambda: deque(maxlen=DEADLINE_HISTORY))
    _bounds: dict[int, NormBound] = field(default_factory=dict)  # by Scope.key
    # the links whose results the last round accepted: they hold the global parameters
    # but for what its outer step changed (Scope.refreshed)
    _current: list[WorkerLink] = field(default_factory=list)
    _staging: StagingPool | None = None
    _sender: Downlink | None = None  # the global parameters as the workers hold them
    _sums: list[np.ndarray] = field(default_factory=list)  # a round's, float64
    _bound_of_last: NormBound = field(default_factory=NormBound)  # the last round's
    _stop_reason: str = "done"

    @property
    def setup_bytes(self) -> int:
        return self.admission.setup_bytes

    def shards_served(self) -> dict[str, Any]:
        """A prepared dataset's shards sent to workers that did not have them: bytes in
        all, and the shard names by worker index."""
        admission = self.admission
        fetched = {str(i): names for i, names in sorted(admission.shards_fetched.items())}
        return {"shard_bytes": admission.shard_bytes, "shards_fetched": fetched}

    def downlink(self) -> Downlink:
        """How global parameters go out (`RunSettings.codec_down`), made once; its `state`
        is the copy the workers hold, which a checkpoint keeps."""
        if self._sender is None:
            names = [spec.name for spec in self.admission.setup.program.param_specs]
            codec = on_the_wire(self.admission.settings.codec_down, self.admission.plugins)
            self._sender = Downlink(names, codec)
        return self._sender

    def start(self) -> None:
        self.admission.stop_late = self.stop_joined
        self.admission.start()
        threading.Thread(target=self._watch_revocations, name="pcp-revoked", daemon=True).start()

    def _watch_revocations(self) -> None:
        """Disconnect a worker as soon as its credential is revoked: the round in flight
        loses it (its result does not count), and admission refuses it from now on."""
        while not self.admission.closing.wait(REVOCATION_POLL_S):
            self._disconnect_revoked()

    def _disconnect_revoked(self) -> None:
        """Close the connections of workers whose credential is revoked (also checked as
        each round starts, so a revocation takes effect within one round however short)."""
        revoked = self.admission.keys.revoked_now()
        for link in list(self.links.values()):
            if (link.hello.worker_name, link.hello.credential) in revoked:
                log.warning("credential revoked; disconnecting the worker", worker=link.label)
                self.merger.revoked.add(link.hello.worker_name)
                link.conn.close()

    def admit_returning(self) -> None:
        """Take in workers that (re)joined since the last round."""
        while True:
            try:
                link = self.admission.joined.get_nowait()
            except queue.Empty:
                return
            self._take(link)

    def _take(self, link: WorkerLink) -> None:
        """Take a joined worker into the next rounds, unless a connected worker has its
        name: names are unique (a default one holds the host and pid, so a restarted
        worker has a new one), and a newcomer must not push a working worker out. A
        quarantined worker is told so and stopped."""
        quarantined = self.merger.accountability.is_quarantined(link.hello.worker_name)
        if quarantined:
            log.warning("refusing a quarantined worker", worker=link.label, reason=quarantined)
            self._turn_away(link, quarantined, "quarantined")
            return
        for old in self.links.values():
            if old.hello.worker_name == link.hello.worker_name:
                log.warning(
                    "a worker of that name is already connected; refusing the newcomer",
                    worker=link.label,
                )
                self._turn_away(link, f"a worker named {link.hello.worker_name} is connected")
                return
        self.merger.revoked.discard(link.hello.worker_name)  # proved a credential not revoked
        self.links[link.index] = link

    def _turn_away(self, link: WorkerLink, reason: str, state: str = "dead") -> None:
        with contextlib.suppress(TransportError, OSError):
            link.conn.send(Stop(reason))
        link.conn.close()
        self.admission.status.worker_state(link.index, state)
        self.admission.release_index(link.index)

    def wait_for_workers(self, count: int, timeout_s: float | None = None) -> None:
        """Block until `count` workers are connected (and have their program).

        Gives up after `timeout_s`, or as soon as `still_coming()` says no more will come
        (the one-command form's local workers have all exited). A worker that connected
        and is being served its program is coming: the wait goes on while it is (a first
        compile for its kind can take minutes).
        """
        self.admit_returning()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        told = False
        while len(self.links) < count:
            remaining = 1.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:  # past the deadline (remaining 0): a second at a time
                self._take(self.admission.joined.get(timeout=min(remaining, 1.0) or 1.0))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    if not self.admission.joining():
                        raise NotEnoughWorkers(
                            f"only {len(self.links)} of {count} workers connected "
                            f"within {timeout_s:.0f} s"
                        ) from None
                    if not told:
                        log.info("join timeout passed; waiting for a worker being served")
                        told = True
                if not self.still_coming():
                    raise NotEnoughWorkers(
                        f"only {len(self.links)} of {count} workers connected and no more "
                        "are coming; see the worker logs in the run directory"
                    ) from None

    def _drop(self, link: WorkerLink) -> None:
        link.conn.close()
        if self.links.get(link.index) is link:
            self.admission.status.worker_state(link.index, "dead")
            del self.links[link.index]
            self.admission.release_index(link.index)

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
        everything = tuple(range(len(specs)))
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
            assignments, changed = {}, set()
            refreshed = everything if scope.refreshed is None else scope.refreshed
            for link in links:
                assignments[link.index] = assignment_for(link.index)
                assignments[link.index].attempt = attempt
                if attempt == 0 and any(link is held for held in self._current):
                    changed.add(link.index)
            self._current = []
            plan = RoundPlan(
                round_index,
                attempt,
                self.downlink().outgoing(params, refreshed),
                assignments,
                changed,
                everything if scope.returned is None else scope.returned,
                self._deadline(max(a.budget_s for a in assignments.values())),
                self.limits.worker_timeout_s,
                self.admission.status,
                {**(excluded or {}), **self._quarantine_reasons()},
                on_the_wire(self.admission.settings.codec, self.admission.plugins),
                weigh,
                self.admission.settings.pushes,
                self.merger.accountability,
                self.spot_checks,
            )
            streams = self.merger.aggregator.streams
            total = RunningSum(self._sums) if streams else HeldResults()
            outcome = run_attempt(plan, links, total, self._staging, bound)
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
                self._durations.append(outcome.report_s)
                bound.remember([step_norm(r) for r in outcome.results.values()])
                self._bound_of_last = bound
                self._current = [link for link in links if link.index in outcome.results]
                return outcome
            every_one_non_finite = outcome.non_finite and outcome.non_finite == set(
                outcome.rejected
            )
            if not outcome.results and every_one_non_finite:
                raise FloatingPointError(
                    f"round {round_index}: every result was NaN or Inf, the run diverged; "
                    "lower --lr"
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
            attempt += 1

    def _quarantine_reasons(self) -> dict[str, str]:
        quarantined = self.merger.accountability.quarantined
        return {name: f"quarantined: {why}" for name, why in quarantined.items()}

    def _stop_quarantined(self) -> None:
        """Disconnect the connected workers that are quarantined now."""
        for link in list(self.links.values()):
            reason = self.merger.accountability.is_quarantined(link.hello.worker_name)
            if reason:
                log.warning("disconnecting a quarantined worker", worker=link.label)
                self._turn_away(link, reason, "quarantined")
                del self.links[link.index]

    def rolled_back(self) -> None:
        """The last round's outer step was undone: its norms are no reference for later
        rounds' (they may hold the very outlier that caused it), the aggregator goes back
        to its state before it, and no worker holds the global parameters the round is
        run again from."""
        self._bound_of_last.forget_last()
        self.merger.undo()
        self._current = []

    def _wait_for_quorum(self, round_index: int) -> None:
        self.admit_returning()
        if len(self.links) >= self.limits.min_workers:
            return
        log.warning(
            "waiting for workers",
            round=round_index,
            connected=len(self.links),
            min_workers=self.limits.min_workers,
            timeout_s=self.limits.join_timeout_s,
        )
        self.wait_for_workers(self.limits.min_workers, self.limits.join_timeout_s)
        log.info("enough workers again", round=round_index, connected=len(self.links))

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

    # -- the end --------------------------------------------------------------------------

    def close(self, reason: str = "done") -> None:
        """Tell every worker to stop, those that joined too late for a round included,
        then close all connections, the listener and the program builds in flight."""
        self._stop_reason = reason
        self.admission.closing.set()
        self._stop(list(self.links.values()))
        self.links.clear()
        self.stop_joined()
        self.admission.close()

    def stop_joined(self) -> None:
        """Stop the workers that joined but were not taken into a round yet."""
        joined = []
        with contextlib.suppress(queue.Empty):
            while True:
                joined.append(self.admission.joined.get_nowait())
        self._stop(joined)

    def _stop(self, links: list[WorkerLink]) -> None:
        """Send each a Stop, read what they still send (results computed ahead of their
        Assignment, `RunSettings.ahead`) until they close their end or STOP_DRAIN_S
        pass, then close: a socket closed with bytes unread resets the connection, and
        on a far link the reset can overtake the Stop."""
        for link in links:
            with contextlib.suppress(TransportError, OSError):
                link.conn.send(Stop(self._stop_reason))
        if not links:
            return
        with ThreadPoolExecutor(len(links), thread_name_prefix="pcp-stop") as pool:
            wait([pool.submit(_drain, link) for link in links], timeout=STOP_DRAIN_S)
            for link in links:
                link.conn.close()  # wakes a drain still reading


def _drain(link: WorkerLink) -> None:
    """Read and drop a stopped worker's messages until it closes the connection."""
    with contextlib.suppress(TransportError, OSError):
        while True:
            link.conn.receive()
