"""How a worker ends a round, with or without overlap (`pcp_core.worker.loop.serve`,
`pcp_core.worker.overlap.OverlappedRounds`): it saves the inner state and sends a
Result (losses, the pseudo-gradient's norm, where its time went); the shepherd answers
with a Fetch, answered with the Delta, or a Discard (also after the Delta, when its
tensors failed the shepherd's checks)."""

from collections.abc import Callable

import structlog

from pcp_core.shepherd.aggregation import delta_norm
from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import Assignment, Delta, Discard, Fetch, Result
from pcp_core.wire.transport import TransportError
from pcp_core.worker.clock import NetworkClock
from pcp_core.worker.session import InnerState, RoundWork

log = structlog.get_logger(__name__)


class Reports:
    """A worker's messages with the shepherd, and the round it reported last."""

    def __init__(self, conn: LiveConnection, inner: InnerState) -> None:
        self.conn, self.inner = conn, inner
        self.clock = NetworkClock()
        self.pending: tuple[Assignment, RoundWork] | None = None  # sent, not yet settled

    def receive(self) -> object:
        return self.clock.receive(self.conn)

    def report(self, assignment: Assignment, work: RoundWork) -> None:
        """Round `assignment.round` is done: save its inner state, send its Result."""
        self.inner.finished(assignment.round)
        norm = delta_norm([t.array for t in work.tensors])
        waited_s, sent_s = self.clock.take()
        timings = (work.compute_s, norm, waited_s, sent_s)
        result = Result(assignment.round, assignment.attempt, work.losses, *timings)
        self.clock.send(self.conn, result)
        self.pending = (assignment, work)

    def settle(self, message: Fetch | Discard, refused: Callable[[], None] = lambda: None) -> None:
        """Answer a Fetch with the Delta; on a Discard, call `refused` and restore the
        inner state the refused round started from."""
        asked = (message.round, message.attempt)
        if self.pending is None or (self.pending[0].round, self.pending[0].attempt) != asked:
            raise TransportError(f"the shepherd asked about round {asked}, not ours")
        if isinstance(message, Fetch):  # pending stays: the tensors may fail a check
            delta = Delta(message.round, message.attempt, self.pending[1].tensors)
            self.clock.send(self.conn, delta)
            return
        log.warning("result refused", round=message.round, reason=message.reason)
        refused()
        self.inner.refused(message.round)
        self.pending = None
