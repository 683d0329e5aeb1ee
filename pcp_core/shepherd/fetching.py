"""The last step of a round's attempt (`pcp_core.shepherd.rounds`): fetch the accepted
pseudo-gradients, a few at a time into staging buffers (a pushed one is already here, in
arrays of its own), check each whole, re-run the sampled ones on the shepherd
(`pcp_core.shepherd.spot_checks`), and only then add it into the sum.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import numpy as np

from pcp_core.shepherd.aggregation import (
    BadResult,
    DeltaSink,
    MalformedDelta,
    StagingPool,
    check_delta,
)
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
from pcp_core.wire.messages import Delta, Fetch, Result
from pcp_core.wire.transport import TransportError


def fetch_deltas(
    plan: RoundPlan,
    accepted: list[Report],
    total: Collector,
    staging: StagingPool,
    outcome: RoundOutcome,
) -> None:
    """Fetch, check and add the accepted reports' deltas into `total`; each worker whose
    delta fails is lost, rejected or refused (`pcp_core.shepherd.outcomes`)."""

    def fetch(link: WorkerLink, result: Result, pushed: Pushed | None) -> None:
        with staging.buffer() if pushed is None else nullcontext(pushed.arrays) as buffer:
            arrays = buffer if pushed else [buffer[i] for i in plan.returned]
            try:
                if pushed is None:
                    link.conn.send(Fetch(plan.round, plan.attempt))
                    sink = DeltaSink(arrays, [staging.specs[i] for i in plan.returned], plan.codec)
                    try:
                        reply = link.conn.receive(sink)
                    finally:
                        sink.settle()
                else:
                    reply, sink = pushed.delta, pushed.sink
                if not isinstance(reply, Delta):
                    raise TransportError(f"expected a Delta, got {type(reply).__name__}")
                if (reply.round, reply.attempt) != (plan.round, plan.attempt):
                    raise BadResult(f"delta for round {reply.round}, fetched for {plan.round}")
                check_delta(arrays, sink.filled_count, result.norm)
                _spot_check(plan, link, result, arrays, outcome, counting)
            except MalformedDelta as error:  # the transport has closed the connection
                reject(link, plan, error, outcome)
                outcome.lost.append(link)
                return
            except (TransportError, OSError) as error:
                lose(link, plan, error, outcome)
                return
            except BadResult as error:
                refuse(link, plan, error, outcome)
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
