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

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import structlog

from pcp_core.shepherd.accountability import Score, norm_ratios
from pcp_core.shepherd.aggregation import (
    BadResult,
    DeltaSink,
    DrainSink,
    MalformedDelta,
    NormBound,
    StagingPool,
    check_result,
    step_norm,
)
from pcp_core.shepherd.fetching import fetch_deltas
from pcp_core.shepherd.links import WorkerLink
from pcp_core.shepherd.outcomes import (
    Collector,
    Pushed,
    Report,
    RoundOutcome,
    RoundPlan,
    lose,
    refuse,
    reject,
)
from pcp_core.wire.messages import Delta, Failure, Result
from pcp_core.wire.transport import TransportError

log = structlog.get_logger(__name__)

DEADLINE_FACTOR = 3.0


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
    fetch_deltas(plan, accepted, total, staging, outcome)
    outcome.seconds = time.perf_counter() - started
    for link in links:
        sent, received = before[link.index]
        outcome.bytes_sent += link.conn.bytes_sent - sent
        outcome.bytes_received += link.conn.bytes_received - received
    return outcome


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
                reject(link, plan, error, outcome)
                outcome.lost.append(link)
                continue
            except (TransportError, OSError) as error:
                lose(link, plan, error, outcome)
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
    try:
        delta = link.conn.receive(sink)
    finally:
        sink.settle()
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
            refuse(link, plan, error, outcome)
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
            refuse(link, plan, error, outcome)
    return accepted
