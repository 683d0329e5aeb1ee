"""One attempt at a round, as data: what it is given (`RoundPlan`) and what it gives back
(`RoundOutcome`), and how a worker's report can fail to count there: its worker lost
(disconnected), its result rejected, or refused (rejected, and the worker told why).
`pcp_core.shepherd.rounds` runs the attempt, `pcp_core.shepherd.fetching` its last step.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import structlog

from pcp_core.codecs import Codec
from pcp_core.shepherd.accountability import Accountability
from pcp_core.shepherd.aggregation import BadResult, DeltaSink, MalformedDelta, NonFinite
from pcp_core.shepherd.links import WorkerLink
from pcp_core.shepherd.spot_checks import SpotChecks
from pcp_core.watch.run_status import RunStatus
from pcp_core.wire.downlink import Outgoing
from pcp_core.wire.messages import Assignment, Delta, Discard, Result
from pcp_core.wire.transport import TransportError

log = structlog.get_logger(__name__)


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
    # the shepherd's own work around it: the plan (the downlink's encoding) and the merge
    plan_s: float = 0.0
    merge_s: float = 0.0


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
    deadline_s: float | None  # None: set by the first report (`pcp_core.shepherd.rounds`)
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


Report = tuple[WorkerLink, Result, Pushed | None]


def lose(link: WorkerLink, plan: RoundPlan, error: Exception, outcome: RoundOutcome) -> None:
    log.warning("worker lost", worker=link.label, round=plan.round, error=str(error))
    link.conn.close()
    outcome.lost.append(link)


def reject(link: WorkerLink, plan: RoundPlan, error: Exception, outcome: RoundOutcome) -> None:
    reason = str(error)
    if isinstance(error, MalformedDelta):  # no honest worker sends one
        reason = plan.accountability.strike(plan.round, link.hello.worker_name, reason)
    log.warning("result rejected", worker=link.label, round=plan.round, reason=reason)
    outcome.rejected[link.index] = reason
    if isinstance(error, NonFinite):
        outcome.non_finite.add(link.index)


def refuse(link: WorkerLink, plan: RoundPlan, error: BadResult, outcome: RoundOutcome) -> None:
    """Reject the result and tell the worker, which stays connected."""
    reject(link, plan, error, outcome)
    try:
        link.conn.send(Discard(plan.round, plan.attempt, str(error)))
    except (TransportError, OSError):
        link.conn.close()
        outcome.lost.append(link)
        return
    plan.status.worker_state(link.index, "ready", plan.round)
