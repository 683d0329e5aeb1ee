"""One attempt at a round: assign, collect reports until the deadline, check, fetch, sum.

1. Every live worker gets its Assignment (the global parameters); each reports a
   `Result` (losses and its pseudo-gradient's norm, no tensors) when done.
2. The round closes when every worker has reported, or at the deadline: a worker still
   busy then is disconnected (it reconnects and is taken into a later round); one that
   went silent was already cut off by the read deadline (`pcp_core.wire.liveness`). A round
   without a deadline of its own (the first) gets one when its first report arrives:
   DEADLINE_FACTOR times that report's time plus the worker timeout.
3. Each report is checked (`pcp_core.shepherd.aggregation`): for this round, finite, no second
   report from the same worker, not from a worker excluded from the round (its last
   result made the outer step implausible, `pcp_core.shepherd.step_guard`), a norm in line with
   the others'. A refused worker is
   told why (`Discard`) and stays connected.
4. The accepted pseudo-gradients are fetched, a few at a time into staging buffers,
   checked whole and only then added into the sum, each weighed as the plan says (DiLoCo:
   by the inner steps it ran, `--merge`). Where deltas are pushed (`RoundPlan.pushed`),
   each is read right after its Result into a buffer of its own, a round trip less.

Under `RunSettings.ahead` a worker may send a round's Result (and Delta) before that
round's Assignment reaches it; the exchange reads it after sending the Assignment. It
counts only if that Assignment continues the worker's last accepted round (same round
and attempt); otherwise it is dropped and the worker's rerun is waited for.

A round may move part of the model (`Scope`, DiLoCo's streaming fragments): its
pseudo-gradients then hold only the parameters it returns, and a worker that took part
in the last round is sent only what that round's outer step changed.
"""

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import structlog

from pcp_core.codecs import Codec
from pcp_core.shepherd.accountability import Accountability, Score, norm_ratios
from pcp_core.shepherd.admission import WorkerLink
from pcp_core.shepherd.aggregation import (
    BadResult,
    DeltaSink,
    DrainSink,
    MalformedDelta,
    NonFinite,
    NormBound,
    StagingPool,
    check_delta,
    check_result,
    step_norm,
)
from pcp_core.shepherd.spot_checks import SpotChecks
from pcp_core.watch.run_status import RunStatus
from pcp_core.wire.downlink import Outgoing
from pcp_core.wire.messages import Assignment, Delta, Discard, Failure, Fetch, Result
from pcp_core.wire.transport import TransportError

log = structlog.get_logger(__name__)

DEADLINE_FACTOR = 3.0


@dataclass
class RoundOutcome:
    round: int
    attempt: int
    results: dict[int, Result] = field(default_factory=dict)  # accepted, by worker index
    # every well-formed report, refused ones too: each says how fast its worker ran
    reported: dict[int, Result] = field(default_factory=dict)
    senders: dict[int, str] = field(default_factory=dict)  # their worker names, by index
    rejected: dict[int, str] = field(default_factory=dict)  # worker index -> why
    # how much each accepted result counted in the merge, where the aggregator says (0-1)
    shares: dict[int, float] = field(default_factory=dict)
    cosines: dict[int, float] = field(default_factory=dict)  # each result's with the merge
    # what each result does to the merge's loss: as a t statistic, as a share of the gain
    harms: dict[int, float] = field(default_factory=dict)
    costs: dict[int, float] = field(default_factory=dict)
    score_s: float = 0.0  # the shepherd's evaluations that scored the results
    spot_checks: int = 0  # results re-run on the shepherd, and how long that took
    spot_check_s: float = 0.0
    non_finite: set[int] = field(default_factory=set)  # rejected for NaN or Inf
    lost: list[WorkerLink] = field(default_factory=list)  # disconnected: dead, late, broken
    bytes_sent: int = 0
    bytes_received: int = 0
    # accepted pseudo-gradients as they crossed the link and as float32, and decoding
    delta_bytes: int = 0
    delta_raw_bytes: int = 0
    decode_s: float = 0.0
    report_s: float = 0.0  # assignments out to the last report (or the deadline)
    seconds: float = 0.0  # the whole attempt, fetching the deltas included


@dataclass(frozen=True)
class Scope:
    """The parameters a round moves, as indices into the parameter specs (None: all).

    `returned`: what each pseudo-gradient holds. `refreshed`: what a worker whose result
    the last round accepted is sent, the parameters that round's outer step changed
    (it holds all the others as they are); any other worker is sent all of them.
    Rounds of one `key` share their norm reference (`NormBound`): a fragment's norms
    compare with that fragment's."""

    key: int = 0
    returned: tuple[int, ...] | None = None
    refreshed: tuple[int, ...] | None = None


class Collector(Protocol):
    """Where the accepted deltas go: a running sum, or copies held for the aggregator."""

    def add(
        self, arrays: list[np.ndarray], indices: tuple[int, ...], weight: int, worker: int
    ) -> None: ...


@dataclass
class RoundPlan:
    round: int
    attempt: int
    outgoing: Outgoing  # the parameters as sent (pcp_core.wire.downlink)
    assignments: dict[int, Assignment]  # worker index -> its assignment, tensors empty
    # worker indices that hold the last parameters: sent the refreshed ones (as changes
    # to their copy under a codec); every other worker is sent all of them
    changed: set[int]
    returned: tuple[int, ...]  # the parameters each pseudo-gradient holds
    deadline_s: float | None  # None: set by the first report (see the module docstring)
    worker_timeout_s: float
    status: RunStatus = field(default_factory=lambda: RunStatus(log_progress=False))
    excluded: dict[str, str] = field(default_factory=dict)  # worker name -> why refused
    codec: Codec | None = None  # pseudo-gradients come encoded (None: float32 as it is)
    # how much an accepted result counts in the round's mean (a positive integer)
    weigh: Callable[[Result], int] = lambda result: 1
    pushed: bool = False  # each Delta follows its Result unasked (RunSettings.pushes)
    # scores each result's norm against the round's median before its tensors are fetched
    accountability: Accountability = field(default_factory=Accountability)
    spot_checks: SpotChecks | None = None  # re-runs sampled results (--spot-check)


@dataclass
class Pushed:
    """A Delta read right after its Result, into arrays of its own."""

    delta: Delta
    arrays: list[np.ndarray]
    sink: DeltaSink


def run_attempt(
    plan: RoundPlan,
    links: list[WorkerLink],
    total: Collector,
    staging: StagingPool,
    bound: NormBound,
) -> RoundOutcome:
    outcome = RoundOutcome(plan.round, plan.attempt)
    before = {link.index: (link.conn.bytes_sent, link.conn.bytes_received) for link in links}
    started = time.perf_counter()
    reports = _collect_reports(plan, links, staging, outcome)
    outcome.report_s = time.perf_counter() - started
    accepted = _check_reports(plan, reports, bound, outcome)
    _fetch(plan, accepted, total, staging, outcome)
    outcome.seconds = time.perf_counter() - started
    for link in links:
        sent, received = before[link.index]
        outcome.bytes_sent += link.conn.bytes_sent - sent
        outcome.bytes_received += link.conn.bytes_received - received
    return outcome


Report = tuple[WorkerLink, Result, Pushed | None]


def _collect_reports(
    plan: RoundPlan, links: list[WorkerLink], staging: StagingPool, outcome: RoundOutcome
) -> list[Report]:
    here = (plan.round, plan.attempt)

    def exchange(link: WorkerLink) -> tuple[Result, Pushed | None] | None:
        assignment = plan.assignments[link.index]
        out = plan.outgoing
        assignment.continues = current = link.index in plan.changed
        assignment.tensors = list(out.changes.values()) if current else list(out.whole)
        link.conn.send(assignment)
        plan.status.worker_state(
            link.index, "training", plan.round, inner_steps=assignment.inner_steps
        )
        while True:
            reply = link.conn.receive()
            plan.status.worker_state(link.index, "reporting", plan.round)
            if isinstance(reply, Failure):
                log.warning("worker failed", worker=link.label, reason=reply.reason)
                return None
            if not isinstance(reply, Result):
                raise TransportError(f"expected a Result, got {type(reply).__name__}")
            if not reply.ahead or (current and (reply.round, reply.attempt) == here):
                return reply, _pushed(plan, link, staging) if plan.pushed else None
            log.info("result computed ahead dropped", worker=link.label, round=reply.round)
            if plan.pushed and not isinstance(
                link.conn.receive(DrainSink(staging.specs, plan.codec)), Delta
            ):
                raise TransportError("expected the Delta of a result computed ahead")

    reports = []
    with ThreadPoolExecutor(max_workers=len(links), thread_name_prefix="pcp-round") as pool:
        futures = {pool.submit(exchange, link): link for link in links}
        late = _wait_for_reports(set(futures), plan)
        done = set(futures) - late
        for future in late:
            link = futures[future]
            log.warning(
                "worker missed the round deadline; disconnecting it",
                worker=link.label,
                round=plan.round,
                deadline_s=round(plan.deadline_s or 0, 1),
            )
            link.conn.close()  # wakes its exchange; it reconnects and rejoins
            outcome.lost.append(link)
        for future in done:
            link = futures[future]
            try:
                result = future.result()
            except MalformedDelta as error:  # pushed; the transport has closed the connection
                _reject(link, plan, error, outcome)
                outcome.lost.append(link)
                continue
            except (TransportError, OSError) as error:
                _lose(link, plan, error, outcome)
                continue
            if result is None:
                outcome.rejected[link.index] = "the worker reported a failure"
                plan.status.worker_state(link.index, "ready", plan.round)
            else:
                reports.append((link, *result))
    return sorted(reports, key=lambda report: report[0].index)


def _pushed(plan: RoundPlan, link: WorkerLink, staging: StagingPool) -> Pushed:
    """The Delta that follows a Result, read into arrays of its own."""
    specs = [staging.specs[i] for i in plan.returned]
    arrays = [np.empty(spec.shape, spec.dtype) for spec in specs]
    sink = DeltaSink(arrays, specs, plan.codec)
    delta = link.conn.receive(sink)
    if not isinstance(delta, Delta):
        raise TransportError(f"expected a Delta, got {type(delta).__name__}")
    return Pushed(delta, arrays, sink)


def _wait_for_reports(pending: set[Future], plan: RoundPlan) -> set[Future]:
    """Wait for the exchanges until the deadline; the ones still running then."""
    started, deadline = time.monotonic(), plan.deadline_s
    while pending:
        timeout = None if deadline is None else max(started + deadline - time.monotonic(), 0)
        done, pending = wait(pending, timeout, return_when=FIRST_COMPLETED)
        if not done:
            return pending
        if deadline is None:
            deadline = DEADLINE_FACTOR * (time.monotonic() - started) + plan.worker_timeout_s
            plan.deadline_s = deadline
    return pending


def _check_reports(
    plan: RoundPlan, reports: list[Report], bound: NormBound, outcome: RoundOutcome
) -> list[Report]:
    """The reports that may be fetched; the others are refused and told why."""
    fine, senders = [], set()
    for link, result, pushed in reports:
        try:
            name = link.hello.worker_name
            if name in senders:
                raise BadResult(f"duplicate sender: {name} already reported")
            if name in plan.excluded:
                raise BadResult(f"excluded from this round: {plan.excluded[name]}")
            check_result(result, plan.round, plan.attempt)
            if plan.spot_checks and (broken := plan.spot_checks.broken_chain(link, result)):
                raise BadResult(plan.accountability.strike(plan.round, name, broken))
            most = plan.assignments[link.index].most_steps()
            if len(result.losses) > most:
                raise BadResult(f"{len(result.losses)} inner steps reported, at most {most} asked")
            senders.add(name)
            outcome.reported[link.index] = result
            fine.append((link, result, pushed))
        except BadResult as error:
            _refuse(link, plan, error, outcome)
    norms = [step_norm(result) for _, result, _ in fine]
    limit = bound.limit(norms)
    names = [link.hello.worker_name for link, _, _ in fine]
    scores = [Score(norm_ratio=ratio) for ratio in norm_ratios(norms)] if norms else []
    struck = plan.accountability.judge(plan.round, names, scores)
    accepted = []
    for (link, result, pushed), name in zip(fine, names, strict=True):
        try:
            if name in struck:
                raise BadResult(struck[name])
            bound.check(step_norm(result), limit)
            accepted.append((link, result, pushed))
        except BadResult as error:
            _refuse(link, plan, error, outcome)
    return accepted


def _lose(link: WorkerLink, plan: RoundPlan, error: Exception, outcome: RoundOutcome) -> None:
    log.warning("worker lost", worker=link.label, round=plan.round, error=str(error))
    link.conn.close()
    outcome.lost.append(link)


def _reject(link: WorkerLink, plan: RoundPlan, error: Exception, outcome: RoundOutcome) -> None:
    reason = str(error)
    if isinstance(error, MalformedDelta):  # no honest worker sends one
        reason = plan.accountability.strike(plan.round, link.hello.worker_name, reason)
    log.warning("result rejected", worker=link.label, round=plan.round, reason=reason)
    outcome.rejected[link.index] = reason
    if isinstance(error, NonFinite):
        outcome.non_finite.add(link.index)


def _refuse(link: WorkerLink, plan: RoundPlan, error: BadResult, outcome: RoundOutcome) -> None:
    """Reject the result and tell the worker, which stays connected."""
    _reject(link, plan, error, outcome)
    try:
        link.conn.send(Discard(plan.round, plan.attempt, str(error)))
    except (TransportError, OSError):
        link.conn.close()
        outcome.lost.append(link)
        return
    plan.status.worker_state(link.index, "ready", plan.round)


def _fetch(
    plan: RoundPlan,
    accepted: list[Report],
    total: Collector,
    staging: StagingPool,
    outcome: RoundOutcome,
) -> None:
    def fetch(link: WorkerLink, result: Result, pushed: Pushed | None) -> None:
        with staging.buffer() if pushed is None else nullcontext(pushed.arrays) as buffer:
            arrays = buffer if pushed else [buffer[i] for i in plan.returned]
            try:
                if pushed is None:
                    link.conn.send(Fetch(plan.round, plan.attempt))
                    sink = DeltaSink(arrays, [staging.specs[i] for i in plan.returned], plan.codec)
                    reply = link.conn.receive(sink)
                else:
                    reply, sink = pushed.delta, pushed.sink
                if not isinstance(reply, Delta):
                    raise TransportError(f"expected a Delta, got {type(reply).__name__}")
                if (reply.round, reply.attempt) != (plan.round, plan.attempt):
                    raise BadResult(f"delta for round {reply.round}, fetched for {plan.round}")
                check_delta(arrays, sink.filled_count, result.norm)
                _spot_check(plan, link, result, arrays, outcome, counting)
            except MalformedDelta as error:  # the transport has closed the connection
                _reject(link, plan, error, outcome)
                outcome.lost.append(link)
                return
            except (TransportError, OSError) as error:
                _lose(link, plan, error, outcome)
                return
            except BadResult as error:
                _refuse(link, plan, error, outcome)
                return
            total.add(arrays, plan.returned, plan.weigh(result), link.index)
        with counting:
            outcome.delta_raw_bytes += sum(array.nbytes for array in arrays)
            outcome.delta_bytes += sink.received_bytes
            outcome.decode_s += sink.decode_s
        outcome.results[link.index] = result
        outcome.senders[link.index] = link.hello.worker_name
        plan.status.worker_state(link.index, "ready", plan.round)

    if not accepted:
        return
    counting = threading.Lock()
    # more would only wait for a buffer; pushed deltas are all here
    workers = len(accepted) if plan.pushed else min(len(accepted), staging.count)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pcp-fetch") as pool:
        for future in [pool.submit(fetch, *report) for report in accepted]:
            future.result()


def _spot_check(
    plan: RoundPlan,
    link: WorkerLink,
    result: Result,
    arrays: list[np.ndarray],
    outcome: RoundOutcome,
    counting: threading.Lock,
) -> None:
    """Re-run the result's round where it is sampled (`pcp_core.shepherd.spot_checks`):
    BadResult, the worker struck, where the result fails."""
    checks = plan.spot_checks
    if checks is None or not checks.sampled(link, plan.assignments[link.index].budget_s):
        return
    started = time.perf_counter()
    failed = checks.check(link, plan, result, arrays)
    seconds = time.perf_counter() - started
    with counting:
        outcome.spot_checks += 1
        outcome.spot_check_s += seconds
        checks.checks += 1
        checks.seconds += seconds
    if failed:
        raise BadResult(failed)
