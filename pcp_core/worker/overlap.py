"""Rounds that overlap the network (`RunSettings.overlap`): a worker that has sent its
result starts the next round at once instead of idling while its pseudo-gradient
travels, the outer step is taken and the new global parameters come back; it folds
those in when they arrive, a few steps into the round.

Round r's Assignment carries the shepherd's global parameters θ_r. Having run round r
from its start S_r to its local parameters L_r, the worker sends Δ_r = S_r − L_r as
always and starts round r + 1 from its own end, L_r moved onto θ_r:

    S_{r+1} = θ_r − Δ_r        (= L_r + (θ_r − S_r))

When the Assignment of round r + 1 arrives with θ_{r+1}, the round (DiLoCo's worker
side) adds θ_{r+1} − S_{r+1} to its parameters and to its start between two calls
(`WorkerSession.global_moved`): from then on it computes where a blocking worker would,
plus the steps it took meanwhile, and its Δ (start − end) is unchanged by the move. Only
the steps before the move were taken from a stale point, as in Streaming DiLoCo's
overlapped communication (Douillard et al., 2025), here with a full outer step.

A Result waits for its round's Assignment (the shepherd expects results for the round it
is in), and the round after it waits for that Assignment too: at most one round is in
flight, so a round takes max(compute, network) instead of their sum. The next round's
data shard is predicted (the shepherd rotates shards by one a round); a worker that
joins or leaves can make the prediction differ, and the speculative round keeps the
predicted shard. Whenever the shepherd asks for something else than the round being
computed (a retried round, one after a refused result, a worker that missed rounds), the
speculative round is dropped and the asked one runs from the Assignment's parameters,
as without overlap; a Stop waits for the running round to end.
"""

import queue
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import structlog

from pcp_core.shepherd.aggregation import delta_norm
from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import Assignment, Delta, Discard, Fetch, Result, Stop, Tensor
from pcp_core.wire.transport import TransportError
from pcp_core.worker.clock import NetworkClock
from pcp_core.worker.session import InnerState, RoundWork, WorkerRound, WorkerSession

log = structlog.get_logger(__name__)


def no_move() -> None:
    """`WorkerSession.global_moved` outside a speculative round."""
    return None


def next_start(global_params: list[np.ndarray], work: RoundWork) -> list[np.ndarray]:
    """θ_r − Δ_r: where the next round starts (see the module docstring)."""
    return [g - d.array for g, d in zip(global_params, work.tensors, strict=True)]


def predicted(done: Assignment, start: list[np.ndarray], names: list[str]) -> Assignment:
    """The Assignment the shepherd will most likely send after `done`, with `start` as
    its parameters."""
    return Assignment(
        done.round + 1,
        done.inner_steps,
        (done.shard_index + 1) % done.shard_count,
        done.shard_count,
        done.seed,
        [Tensor(name, array) for name, array in zip(names, start, strict=True)],
    )


@dataclass
class Speculation:
    """A round computing ahead of its Assignment."""

    assignment: Assignment  # the predicted one, its tensors the start
    work: Future[RoundWork]
    moves: queue.SimpleQueue[list[np.ndarray]]  # θ_{r+1} − S_{r+1}, once it is known

    def global_moved(self) -> list[np.ndarray] | None:
        """For `WorkerSession.global_moved`, called by the round between its calls."""
        try:
            return self.moves.get_nowait()
        except queue.Empty:
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
        self.conn, self.session, self.worker_round, self.inner = conn, session, worker_round, inner
        self.clock = NetworkClock()
        self.compute = ThreadPoolExecutor(1, thread_name_prefix="pcp-round")
        self.speculation: Speculation | None = None
        self.pending: tuple[Assignment, RoundWork] | None = None  # sent, not yet settled
        self.names = [spec.name for spec in session.executor.param_specs]

    def serve(self) -> None:
        """Rounds until Stop."""
        try:
            while True:
                message = self.clock.receive(self.conn)
                if isinstance(message, Stop):
                    log.info("stopping", reason=message.reason)
                    return
                if isinstance(message, Assignment):
                    self._assigned(message)
                elif isinstance(message, Fetch | Discard):
                    self._settle(message)
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
                start = [t.array for t in ahead.tensors]
                moved = [t.array - s for t, s in zip(assignment.tensors, start, strict=True)]
                speculation.moves.put(moved)
                work = speculation.work.result()
                self.session.global_moved = no_move
                self._report(assignment, work)
                return
            self._drop(speculation)
        self.inner.prepare(assignment.round)
        self._report(assignment, self.worker_round(self.session, assignment))

    def _report(self, assignment: Assignment, work: RoundWork) -> None:
        """Round `assignment.round` is done: save its inner state, send its Result, and
        start the next round from θ_r − Δ_r."""
        self.inner.finished(assignment.round)
        norm = delta_norm([t.array for t in work.tensors])
        waited_s, sent_s = self.clock.take()
        timings = (work.compute_s, norm, waited_s, sent_s)
        self.clock.send(
            self.conn, Result(assignment.round, assignment.attempt, work.losses, *timings)
        )
        self.pending = (assignment, work)
        global_params = [t.array for t in assignment.tensors]
        following = predicted(assignment, next_start(global_params, work), self.names)
        moves: queue.SimpleQueue[list[np.ndarray]] = queue.SimpleQueue()
        speculation = Speculation(following, Future(), moves)
        self.session.global_moved = speculation.global_moved
        speculation.work = self.compute.submit(self.worker_round, self.session, following)
        self.speculation = speculation

    def _settle(self, message: Fetch | Discard) -> None:
        asked = (message.round, message.attempt)
        if self.pending is None or (self.pending[0].round, self.pending[0].attempt) != asked:
            raise TransportError(f"the shepherd asked about round {asked}, not ours")
        if isinstance(message, Fetch):  # pending stays: the tensors may fail a check
            delta = Delta(message.round, message.attempt, self.pending[1].tensors)
            self.clock.send(self.conn, delta)
            return
        log.warning("result refused", round=message.round, reason=message.reason)
        self._drop_speculation()  # it started from the refused round's parameters
        self.inner.refused(message.round)
        self.pending = None

    def _drop_speculation(self) -> None:
        if self.speculation is not None:
            speculation, self.speculation = self.speculation, None
            self._drop(speculation)

    def _drop(self, speculation: Speculation) -> None:
        """Wait for a speculative round to end and forget it: the executor's inner state
        is then not the one the store says, so the next round restores it."""
        speculation.work.exception()  # its end, whatever it was
        self.session.global_moved = no_move
        self.inner.after_round = None
        log.info("speculative round dropped", round=speculation.assignment.round)
