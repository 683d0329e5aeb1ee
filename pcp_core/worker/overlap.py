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

A Result waits for its round's Assignment (the shepherd expects results for the round it
is in; a round that ends first waits for it to fold it in), so at most one round is in
flight: a round takes max(compute, network) instead of their sum. The next round's data
shard is predicted (the shepherd rotates shards by one a round); a worker that joins or
leaves can make the prediction differ, and the speculative round keeps the predicted
shard. Whenever the shepherd asks for something else than the round being computed (a
retried round, one after a refused result, a worker that missed rounds), the speculative
round is stopped at its next call and dropped, and the asked one runs from the
Assignment's parameters (then all of them), as without overlap; a Stop does the same.
"""

import queue
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import structlog

from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import Assignment, Discard, Fetch, Stop
from pcp_core.wire.transport import TransportError
from pcp_core.worker.reports import Reports
from pcp_core.worker.session import InnerState, RoundWork, WorkerRound, WorkerSession

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
class Speculation:
    """A round computing ahead of its Assignment."""

    assignment: Assignment  # the predicted one
    work: Future[RoundWork] = field(default_factory=Future)
    # the real Assignment, once here; None: the round is dropped
    arrivals: queue.SimpleQueue[Assignment | None] = field(default_factory=queue.SimpleQueue)
    taken: bool = False

    def arrived(self, wait: bool) -> Assignment | None:
        """For `WorkerSession.arrived`, called by the round between its calls and at
        its end: the Assignment once, then None; SpeculationDropped once dropped."""
        if self.taken:
            return None
        try:
            assignment = self.arrivals.get(block=wait)
        except queue.Empty:
            return None
        if assignment is None:
            raise SpeculationDropped
        self.taken = True
        return assignment


def not_speculating(wait: bool) -> None:
    """`WorkerSession.arrived` outside a speculative round."""
    return None


class OverlappedRounds:
    """The worker's message loop with one round computing ahead (see the module
    docstring); `pcp_core.worker.loop.serve` is the loop without."""

    def __init__(
        self,
        conn: LiveConnection,
        session: WorkerSession,
        worker_round: WorkerRound,
        inner: InnerState,
    ) -> None:
        self.session, self.worker_round, self.inner = session, worker_round, inner
        self.reports = Reports(conn, inner)
        self.compute = ThreadPoolExecutor(1, thread_name_prefix="pcp-round")
        self.speculation: Speculation | None = None

    def serve(self) -> None:
        """Rounds until Stop."""
        try:
            while True:
                message = self.reports.receive()
                if isinstance(message, Stop):
                    log.info("stopping", reason=message.reason)
                    return
                if isinstance(message, Assignment):
                    self._assigned(message)
                elif isinstance(message, Fetch | Discard):
                    # a refused round's speculative successor started from its end
                    self.reports.settle(message, refused=self._drop_speculation)
                else:
                    raise TransportError(f"unexpected {type(message).__name__} from the shepherd")
        finally:
            self._drop_speculation()
            self.compute.shutdown(wait=True)

    def _assigned(self, assignment: Assignment) -> None:
        speculation, self.speculation = self.speculation, None
        if speculation is not None:
            ahead = speculation.assignment
            if (ahead.round, 0) == (assignment.round, assignment.attempt):
                speculation.arrivals.put(assignment)
                work = speculation.work.result()
                self.session.arrived = not_speculating
                self._report(assignment, work)
                return
            self._drop(speculation)
        self.inner.prepare(assignment.round)
        self._report(assignment, self.worker_round(self.session, assignment))

    def _report(self, assignment: Assignment, work: RoundWork) -> None:
        """Round `assignment.round` is done: report it, and start the next round from
        where this one ended."""
        self.reports.report(assignment, work)
        speculation = Speculation(predicted(assignment))
        self.session.arrived = speculation.arrived
        speculation.work = self.compute.submit(
            self.worker_round, self.session, speculation.assignment
        )
        self.speculation = speculation

    def _drop_speculation(self) -> None:
        if self.speculation is not None:
            speculation, self.speculation = self.speculation, None
            self._drop(speculation)

    def _drop(self, speculation: Speculation) -> None:
        """Stop a speculative round at its next call and forget it: the executor's inner
        state is then not the one the store says, so the next round restores it."""
        speculation.arrivals.put(None)
        speculation.work.exception()  # its end, whatever it was
        self.session.arrived = not_speculating
        self.inner.after_round = None
        log.info("speculative round dropped", round=speculation.assignment.round)
