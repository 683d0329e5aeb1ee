"""How a worker ends a round, with or without overlap (`pcp_core.worker.loop.serve`,
`pcp_core.worker.overlap.OverlappedRounds`): it saves the inner state and sends a
Result (losses, the pseudo-gradient's norm, where its time went); the shepherd answers
with a Fetch, answered with the Delta, or a Discard (also after the Delta, when its
tensors failed the shepherd's checks). Where the run pushes deltas
(`RunSettings.pushes`) the Delta follows the Result at once and a
Discard is the only answer; with rounds reported ahead, several rounds may await one.

Under a codec other than f32 (`RunSettings.codec`) the pseudo-gradient is encoded when
the round ends, each tensor sent as its bytes, and the norm the Result announces is the
decoded one's: what the shepherd will check and sum.

In an audited run (`RunSettings.audited`, blocking rounds only) the state each round
started from is kept until the rounds after it are settled, and its Result carries that
state's digest; an Audit is answered with the state (`pcp_core.worker.audits`)."""

import threading
import time
from collections.abc import Callable

import numpy as np
import structlog

from pcp_core.codecs import CodecLookup, Feedback
from pcp_core.parallel import delta_norm, each
from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import (
    Assignment,
    Audit,
    AuditState,
    Delta,
    Discard,
    Fetch,
    Result,
    Stop,
    Tensor,
)
from pcp_core.wire.transport import TransportError
from pcp_core.worker.audits import RoundStart
from pcp_core.worker.clock import NetworkClock
from pcp_core.worker.session import InnerState, RoundWork

log = structlog.get_logger(__name__)


def dispatch(
    receive: Callable[[], object],
    assigned: Callable[[Assignment], None],
    settle: Callable[[Fetch | Discard], None],
    audit: Callable[[Audit], None] | None = None,
) -> None:
    """Route the shepherd's messages until a Stop, for either round loop: an Assignment
    to `assigned`, a Fetch or Discard to `settle`, an Audit to `audit` (an audited run's
    blocking loop; none under overlap). TransportError on anything else."""
    while True:
        message = receive()
        if isinstance(message, Stop):
            log.info("stopping", reason=message.reason)
            return
        if isinstance(message, Assignment):
            assigned(message)
        elif isinstance(message, Fetch | Discard):
            settle(message)
        elif isinstance(message, Audit) and audit is not None:
            audit(message)
        else:
            raise TransportError(f"unexpected {type(message).__name__} from the shepherd")


class Reports:
    """A worker's messages with the shepherd, and the round it reported last."""

    def __init__(self, conn: LiveConnection, inner: InnerState, codecs: CodecLookup) -> None:
        self.conn, self.inner = conn, inner
        self.clock = NetworkClock()
        settings = inner.session.settings
        codec = settings.uplink(codecs)
        self.feedback = None if codec is None else Feedback(codec, decay=settings.feedback_decay)
        inner.feedback = self.feedback  # saved and restored with the inner state
        inner.session.downlink.codec = settings.downlink(codecs)
        self.push = settings.pushes
        self.kept = settings.ahead + 1  # the rounds reported ahead, and the one before
        # sent, not yet settled, by (round, attempt): the tensors its Delta carries (none
        # once pushed); the newest `kept`
        self.pending: dict[tuple[int, int], list[Tensor]] = {}
        self.lock = threading.Lock()  # rounds reported ahead are reported off the loop
        self.audited = settings.audited
        self.opt_names = [name for name, _, _ in settings.opt_specs]
        # in an audited run, by (round, attempt): the state the round started from
        self.starts: dict[tuple[int, int], RoundStart] = {}

    def receive(self) -> object:
        """The shepherd's next message; an Assignment's tensors as float32 values (its
        encoded changes added to the worker's copy, `pcp_core.wire.downlink`)."""
        message = self.clock.receive(self.conn)
        if isinstance(message, Assignment):
            message.tensors = self.inner.session.downlink.take(message.tensors)
        return message

    def started(self, assignment: Assignment) -> None:
        """In an audited run, keep the state the round starts from: the inner optimizer
        state (restored for it) and what the codec's error feedback owes."""
        if not self.audited:
            return
        opt_state = [np.array(array) for array in self.inner.session.executor.opt_state()]
        owed = {} if self.feedback is None else self.feedback.residuals
        start = RoundStart(opt_state, {name: array.copy() for name, array in owed.items()})
        self.starts[(assignment.round, assignment.attempt)] = start
        for old in list(self.starts)[: -(self.kept + 1)]:
            del self.starts[old]

    def audit(self, message: Audit) -> None:
        """Send the state a round started from, as its Result's digest committed to."""
        start = self.starts.get((message.round, message.attempt))
        if start is None:
            raise TransportError(f"the shepherd audits round {message.round}, not one of ours")
        tensors = start.tensors(self.opt_names)
        self.clock.send(self.conn, AuditState(message.round, message.attempt, tensors))

    def report(self, assignment: Assignment, work: RoundWork) -> None:
        """Blocking round `assignment.round` is done: encode its pseudo-gradient, save its
        inner state (with what error feedback owes after it), send its Result (and
        Delta, where pushed)."""
        started = time.perf_counter()
        tensors, norm = self.encoded(work.tensors)
        encode_s = time.perf_counter() - started
        self.inner.finished(assignment.round)
        self.send(assignment, work, encoded=(tensors, norm, encode_s))

    def send(
        self,
        assignment: Assignment,
        work: RoundWork,
        ahead: bool = False,
        encoded: tuple[list[Tensor], float, float] | None = None,
    ) -> None:
        """The Result (and Delta) of a round whose inner state is saved, encoded here
        unless `encoded` (tensors, norm, seconds) and sent: off the round's thread under
        overlap (`pcp_core.worker.overlap`); `ahead`: before its Assignment came."""
        if encoded is None:
            started = time.perf_counter()
            tensors, norm = self.encoded(work.tensors)
            encode_s = time.perf_counter() - started
        else:
            tensors, norm, encode_s = encoded
        waited_s, sent_s = self.clock.take()
        timings = (work.compute_s, norm, waited_s, sent_s, encode_s)
        asked = (assignment.round, assignment.attempt)
        with self.lock:  # before the shepherd can answer it
            self.pending[asked] = [] if self.push else tensors
            for old in list(self.pending)[: -self.kept]:
                del self.pending[old]
        start = self.starts.get(asked)
        digest = "" if start is None else start.digest(self.opt_names)
        result = Result(*asked, work.losses, *timings, ahead=ahead, state_digest=digest)
        self.clock.send(self.conn, result)
        if self.push:
            self.clock.send(self.conn, Delta(*asked, tensors))

    def encoded(self, tensors: list[Tensor]) -> tuple[list[Tensor], float]:
        """The tensors as the Delta carries them, and the norm the shepherd will see."""
        if self.feedback is None:
            return tensors, delta_norm([t.array for t in tensors])
        feedback = self.feedback
        elements = sum(t.array.size for t in tensors)
        encoded = each(lambda t: feedback.encode(t.name, t.array), tensors, elements)
        sent = [
            Tensor(tensor.name, np.frombuffer(data, np.uint8))
            for tensor, (data, _) in zip(tensors, encoded, strict=True)
        ]
        return sent, delta_norm([values for _, values in encoded])

    def settle(self, message: Fetch | Discard, refused: Callable[[], None] = lambda: None) -> None:
        """Answer a Fetch with the Delta; on a Discard, call `refused` and restore the
        inner state the refused round started from."""
        asked = (message.round, message.attempt)
        with self.lock:
            tensors = self.pending.get(asked)
        if tensors is None or (isinstance(message, Fetch) and self.push):
            raise TransportError(f"the shepherd asked about round {asked}, not ours")
        if isinstance(message, Fetch):  # pending stays: the tensors may fail a check
            self.clock.send(self.conn, Delta(*asked, tensors))
            return
        log.warning("result refused", round=message.round, reason=message.reason)
        refused()  # no round runs on from here
        with self.lock:
            self.pending.clear()
        self.inner.refused(message.round)
