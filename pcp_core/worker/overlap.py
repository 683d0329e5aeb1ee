"""Rounds that overlap the network (`RunSettings.overlap`): a worker that has sent its
result starts the next round at once instead of idling while its pseudo-gradient
travels, the outer step is taken and the new global parameters come back; it folds
those in when they arrive, a few steps into the round.

Round r's Assignment carries the shepherd's global parameters θ_r (with streaming
fragments, the part of them the last round changed). Having run round r, the worker
sends its pseudo-gradient as always and starts round r + 1 from where round r left its
parameters, with no tensors in its (predicted) Assignment. When the real Assignment of
round r + 1 arrives, the round (DiLoCo's worker side, `pcp_diloco.worker_side`) takes
its tensors in between two calls (`WorkerSession.arrived`): each parameter moves by how
far the new global value is from the one the last pseudo-gradient was measured from.
From then on it computes where a blocking worker would, plus the steps it took
meanwhile, whose progress goes into its next pseudo-gradient. Only the steps before the
fold were taken from a stale point, as in Streaming DiLoCo's overlapped communication
(Douillard et al., 2025), here with a full outer step.

By default a Result waits for its round's Assignment (a round that ends first waits for
it and folds it in), so at most one round is in flight: a round takes max(compute,
network) instead of their sum. With `RunSettings.ahead` = D a round that ends before its
Assignment is reported at once, marked `ahead`, and the next one starts, as long as no
more than D rounds are reported ahead of their Assignments; a round that would be the
(D + 1)th waits for the oldest one's Assignment and folds it in. So up to D + 1 rounds
are in flight and a round takes max(compute, network / (D + 1)). The pseudo-gradient is
the same either way (a fold moves the parameters and the point they are measured from
alike), and the shepherd counts a result computed ahead only if the Assignment it then
sends continues the worker's last accepted round.

The next round's data shard is predicted (the shepherd rotates shards by one a round);
a worker that joins or leaves can make the prediction differ, and the speculative round
keeps the predicted shard. Whenever the shepherd asks for something else than the
rounds in flight (a retried round, one after a refused result, a worker that missed
rounds), the speculative round is stopped at its next call and dropped, and the asked
one runs from the Assignment's parameters (then all of them), as without overlap; a
Stop does the same. Rounds run on a thread of their own, which saves each one's inner
state as it ends and hands its report to a sending thread (encoding and sending it
while the next round computes); the message loop routes what the shepherd sends.
"""

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import structlog

from pcp_core.codecs import CodecLookup
from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import Assignment, Discard, Fetch
from pcp_core.wire.transport import TransportError
from pcp_core.worker.reports import Reports, dispatch
from pcp_core.worker.session import InnerState, WorkerRound, WorkerSession

log = structlog.get_logger(__name__)


class SpeculationDropped(Exception):
    """Ends a speculative round that will not be reported."""


def predicted(done: Assignment) -> Assignment:
    """The Assignment the shepherd will most likely send after `done`, without tensors:
    the round goes on from the worker's own parameters until the real one arrives (and
    its schedule from the real one's `schedule_step`)."""
    return Assignment(
        done.round + 1,
        done.inner_steps,
        (done.shard_index + 1) % done.shard_count,
        done.shard_count,
        done.seed,
        budget_s=done.budget_s,
        schedule_step=done.schedule_step + done.inner_steps if done.schedule_step >= 0 else -1,
    )


@dataclass
class Round:
    """A round on the compute thread: one asked for (`given`), or one computing ahead of
    its Assignment, whose real Assignment (and, after rounds reported ahead, theirs)
    come through `arrivals`."""

    assignment: Assignment  # the given one, or the predicted one
    given: bool = False
    depth: int = 0  # how many rounds may be reported ahead (RunSettings.ahead)
    earlier: int = 0  # rounds before it reported ahead whose Assignments are still due
    real: Assignment | None = None  # its own Assignment, once taken
    newest: Assignment | None = None  # the last Assignment it took, its own or not
    arrivals: queue.SimpleQueue[Assignment | None] = field(default_factory=queue.SimpleQueue)
    dropped: bool = False
    work: Future[None] = field(default_factory=Future)

    def __post_init__(self) -> None:
        if self.given:
            self.real = self.assignment

    def due(self, assignment: Assignment) -> bool:
        """Whether `assignment` is one this round takes in: its own, or one of a round
        reported ahead before it; either continuing this worker's rounds."""
        first = self.assignment.round - self.earlier
        continuing = assignment.continues and assignment.attempt == 0
        return not self.given and continuing and first <= assignment.round <= self.assignment.round

    def arrived(self, wait: bool) -> Assignment | None:
        """For `WorkerSession.arrived`, called by the round between its calls and at its
        end: the next Assignment that came, or None. `wait` blocks while the round may
        not end: until its own Assignment came, or, where it may end ahead, while D
        rounds before it are reported ahead. SpeculationDropped once dropped (a round
        asked for, too: nothing but that comes for it)."""
        must_wait = self.real is None and self.earlier >= self.depth
        try:
            assignment = self.arrivals.get(block=wait and must_wait and not self.given)
        except queue.Empty:
            return None
        if assignment is None:
            raise SpeculationDropped
        if assignment.round == self.assignment.round:
            self.real = assignment
        else:
            self.earlier -= 1
        self.newest = assignment
        return assignment

    def leftover(self) -> list[Assignment]:
        """What came after the round's last look: handed on to the next round."""
        left = []
        while not self.arrivals.empty():
            assignment = self.arrivals.get()
            if assignment is not None:
                left.append(assignment)
        return left


class OverlappedRounds:
    """The worker's message loop with rounds computing ahead (see the module
    docstring); `pcp_core.worker.loop.serve` is the loop without."""

    def __init__(
        self,
        conn: LiveConnection,
        session: WorkerSession,
        worker_round: WorkerRound,
        inner: InnerState,
        codecs: CodecLookup,
    ) -> None:
        self.conn, self.session, self.worker_round, self.inner = conn, session, worker_round, inner
        self.reports = Reports(conn, inner, codecs)
        self.depth = session.settings.ahead
        self.compute = ThreadPoolExecutor(1, thread_name_prefix="pcp-round")
        self.sending = ThreadPoolExecutor(1, thread_name_prefix="pcp-report")
        self.lock = threading.Lock()  # the running round, between the two threads
        self.running: Round | None = None
        self.failure: BaseException | None = None  # what ended the compute thread

    def serve(self) -> None:
        """Rounds until Stop."""
        try:
            dispatch(self._receive, self._assigned, self._settle)
        finally:
            self._stop_running()
            self.compute.shutdown(wait=True)
            self.sending.shutdown(wait=True)

    def _settle(self, message: Fetch | Discard) -> None:
        # a refused round's successor started from its end
        self.reports.settle(message, refused=self._stop_running)

    def _receive(self) -> object:
        try:
            return self.reports.receive()
        except (TransportError, OSError):
            if self.failure is not None:  # the compute thread closed the connection
                raise self.failure from None
            raise

    def _assigned(self, assignment: Assignment) -> None:
        with self.lock:
            running = self.running
            if running is not None and running.due(assignment):
                running.arrivals.put(assignment)
                return
        self._stop_running()
        with self.lock:
            self._start(Round(assignment, given=True))

    def _start(self, round_: Round) -> None:
        self.running = round_
        round_.work = self.compute.submit(self._run, round_)

    def _run(self, round_: Round) -> None:
        """On the compute thread: the round, its report, and the next round's start."""
        try:
            if round_.dropped:  # before it began
                return
            if round_.given:
                self.inner.prepare(round_.assignment.round)
            self.session.arrived = round_.arrived
            work = self.worker_round(self.session, round_.assignment)
            with self.lock:
                if round_.dropped:
                    return
                done = round_.real or round_.assignment
                self.inner.finished(done.round)
                self.sending.submit(
                    self._guarded, self.reports.send, done, work, round_.real is None
                )
                guess = predicted(done)
                if round_.newest is not None:  # the shepherd's last word on the budget
                    guess.budget_s = round_.newest.budget_s
                follower = Round(
                    guess, depth=self.depth, earlier=round_.earlier + (round_.real is None)
                )
                for assignment in round_.leftover():
                    follower.arrivals.put(assignment)
                self._start(follower)
        except SpeculationDropped:
            return
        except BaseException as error:
            self._fail(error)
            raise

    def _guarded(self, job: Callable[..., None], *args: object) -> None:
        try:
            job(*args)
        except BaseException as error:
            self._fail(error)
            raise

    def _fail(self, error: BaseException) -> None:
        """A round or its report failed: the message loop, woken, raises `error`."""
        self.failure = error
        self.conn.close()

    def _stop_running(self) -> None:
        """Stop the round in flight at its next call and forget it: the executor's inner
        state is then not the one the store says, so the next round restores it."""
        with self.lock:
            running, self.running = self.running, None
            if running is None:
                return
            running.dropped = True
            running.arrivals.put(None)
        running.work.exception()  # its end, whatever it was
        self.session.arrived = lambda wait: None
        self.inner.after_round = None
        if not running.given:
            log.info("speculative round dropped", round=running.assignment.round)
