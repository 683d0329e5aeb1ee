"""Spot checks: the shepherd re-runs a sampled worker's round and compares its result.

Norms, cosines and the merge's loss judge a result by what it looks like; a spot check
judges the work. A fetched result is sampled with probability `--spot-check`; the
shepherd then asks its worker for the state the round started from (`Audit`), which the
Result committed to by digest (`pcp_core.worker.audits`), loads the worker's own program on this
machine, runs the round from the global parameters the worker was sent, on the batches
its index and round draw, through the algorithm's own worker side, encodes the
pseudo-gradient with the worker's error feedback, and compares losses and decoded values
with what arrived. Beyond `TOLERANCE` (relative), or with a state that is not the one
committed to, the result is refused and its worker struck. The cost is a worker's round
of compute on the shepherd per check, one check at a time, while the round waits.

A state is the worker's to choose before its first Result; from there on it is bound:
where a check re-ran a round exactly, the state it ended in is what the worker's next
round, on the same connection, must say it started from. A worker that forged its state
between two rounds is caught by the check of the first of them.

Checked: workers whose program this machine can run (the cpu backend; a GPU worker's
program needs its GPU), in blocking rounds of the whole model without time budgets (the
shepherd refuses --spot-check with the others).
"""

import dataclasses
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import structlog

from pcp_core.codecs import Feedback
from pcp_core.data.shards import PreparedDataset
from pcp_core.wire.messages import Audit, AuditState, Result, RunSettings, WorkerSettings
from pcp_core.wire.transport import TransportError
from pcp_core.worker.audits import RoundStart
from pcp_core.worker.session import WorkerRound, WorkerSession

log = structlog.get_logger(__name__)

# The relative difference (L2, of the decoded pseudo-gradient and of the losses) a check
# allows. A worker's program re-run on the same machine and runtime is exact (0 in every
# check of the spot-check tests); another CPU may take other kernels' paths.
TOLERANCE = 1e-3


@dataclasses.dataclass
class Checked:
    """One check's finding: the relative differences, and the state the round ended in."""

    delta_difference: float
    loss_difference: float
    end_digest: str


@dataclasses.dataclass
class SpotChecks:
    """The shepherd's spot checks of one run (see the module docstring)."""

    fraction: float
    settings: RunSettings
    admission: Any  # pcp_core.shepherd.admission.Admission: corpus, plugins, provisioning
    worker_round: WorkerRound
    choose: Callable[[], float] = secrets.SystemRandom().random  # no worker can predict it
    checks: int = 0  # counted, with their seconds, by the round that asked for them
    failures: int = 0  # results that failed a check, or broke the chain of a checked one
    seconds: float = 0.0
    _executors: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)
    _runnable: dict[tuple[str, str], bool] = dataclasses.field(default_factory=dict)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    # by worker name: the round last checked exactly, its connection, and the digest of
    # the state it ended in
    _continues: dict[str, tuple[int, Any, str]] = dataclasses.field(default_factory=dict)

    def sampled(self, link: Any, budget_s: float) -> bool:
        """Whether to check this fetched result of `link`'s."""
        return budget_s <= 0 and self.choose() < self.fraction and self._can_run(link)

    def broken_chain(self, link: Any, result: Result) -> str | None:
        """Why `result` cannot be the round after the one last checked exactly (its
        start is not that round's end), or None."""
        name = link.hello.worker_name
        with self._lock:
            kept = self._continues.pop(name, None)
        if kept is None:
            return None
        checked_round, conn, end_digest = kept
        if conn is not link.conn or result.round != checked_round + 1:
            return None  # a reconnected worker restores its state from its own disk
        if result.state_digest != end_digest:
            self.failures += 1
            return (
                f"its round started from another state than the one its round "
                f"{checked_round}, checked, ended in"
            )
        return None

    def check(self, link: Any, plan: Any, result: Result, arrays: list[np.ndarray]) -> str | None:
        """Ask for the round's starting state, re-run the round, compare: why the result
        fails the check, or None. TransportError where the worker does not answer."""
        started = time.perf_counter()
        link.conn.send(Audit(plan.round, plan.attempt))
        reply = link.conn.receive()
        if not isinstance(reply, AuditState) or (reply.round, reply.attempt) != (
            plan.round,
            plan.attempt,
        ):
            raise TransportError(f"expected the audited state, got {type(reply).__name__}")
        settings = self._worker_settings(link.index)
        try:
            start = RoundStart.from_tensors(
                reply.tensors, list(settings.opt_specs), list(settings.param_specs)
            )
        except ValueError as error:
            return self._failed(link, plan, str(error))
        if start.digest([name for name, _, _ in settings.opt_specs]) != result.state_digest:
            return self._failed(link, plan, "its state is not the one its result named")
        found = self._rerun(link, plan, settings, start, result, arrays)
        log.info(
            "spot check",
            worker=link.label,
            round=plan.round,
            difference=found.delta_difference,
            loss_difference=found.loss_difference,
            seconds=round(time.perf_counter() - started, 3),
        )
        if not (found.delta_difference <= TOLERANCE and found.loss_difference <= TOLERANCE):
            return self._failed(
                link,
                plan,
                f"its result differs from the round re-run from its state by "
                f"{found.delta_difference:.2%} (losses {found.loss_difference:.2%})",
            )
        if found.delta_difference == 0.0:
            with self._lock:
                self._continues[link.hello.worker_name] = (plan.round, link.conn, found.end_digest)
        return None

    def _failed(self, link: Any, plan: Any, problem: str) -> str:
        self.failures += 1
        return plan.accountability.strike(plan.round, link.hello.worker_name, problem)

    def _rerun(
        self,
        link: Any,
        plan: Any,
        settings: WorkerSettings,
        start: RoundStart,
        result: Result,
        arrays: list[np.ndarray],
    ) -> Checked:
        """The round as the worker should have run it, on this machine's copy of its
        program; one at a time (the executor holds one state)."""
        assignment = dataclasses.replace(
            plan.assignments[link.index], tensors=list(plan.outgoing.whole)
        )
        with self._lock:
            executor = self._executor(link)
            executor.set_opt_state(start.opt_state)
            corpus = self._corpus(link.index)
            session = WorkerSession(link.index, executor, corpus, settings)
            work = self.worker_round(session, assignment)
            codec = settings.uplink(self.admission.plugins)
            if codec is None:
                replayed = [tensor.array for tensor in work.tensors]
                owed: dict[str, np.ndarray] = {}
            else:
                owing = {n: a.copy() for n, a in start.residuals.items()}
                feedback = Feedback(codec, owing, settings.feedback_decay)
                replayed = [feedback.encode(t.name, t.array)[1] for t in work.tensors]
                owed = feedback.residuals
            end = RoundStart([np.array(a) for a in executor.opt_state()], owed)
        opt_names = [name for name, _, _ in settings.opt_specs]
        return Checked(
            relative_difference(arrays, replayed),
            relative_difference([np.array(result.losses)], [np.array(work.losses)]),
            end.digest(opt_names),
        )

    def _can_run(self, link: Any) -> bool:
        """Whether this machine runs the worker's program (its backend's device is here)."""
        key = (link.hello.backend, link.hello.arch)
        if key not in self._runnable:
            backend = self.admission.plugins.backend(link.hello.backend)
            try:
                backend.runtime.require_device(backend, None)
                self._runnable[key] = True
            except Exception as error:  # each runtime says no in its own way
                self._runnable[key] = False
                log.warning(
                    "spot checks skip these workers: this machine cannot run their program",
                    backend=link.hello.backend,
                    arch=link.hello.arch,
                    error=str(error).splitlines()[0] if str(error) else type(error).__name__,
                )
        return self._runnable[key]

    def _executor(self, link: Any) -> Any:
        key = (link.hello.backend, link.hello.arch)
        if key not in self._executors:
            backend = self.admission.plugins.backend(link.hello.backend)
            artifact = self.admission.provisioning.program_for(backend, link.hello.arch)
            program = self.admission.setup.program
            self._executors[key] = backend.runtime.open(artifact.data, backend, program, None)
        return self._executors[key]

    def _worker_settings(self, index: int) -> WorkerSettings:
        provisioning = self.admission.provisioning
        return provisioning.worker_settings(provisioning.shard_names(index))

    def _corpus(self, index: int) -> Any:
        """The worker's training data: the whole text corpus, or its share of the shards."""
        corpus = self.admission.setup.corpus
        names = self.admission.provisioning.shard_names(index)
        if names is None:
            return corpus
        return PreparedDataset(corpus.directory, corpus.manifest, names, corpus.paths)


def relative_difference(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """‖got − want‖ / ‖want‖ over all the arrays (float64; 0 for two zeros)."""
    pairs = zip(got, want, strict=True)
    difference = sum(float(np.sum((g.astype(np.float64) - w) ** 2)) for g, w in pairs)
    size = sum(float(np.sum(np.square(w, dtype=np.float64))) for w in want)
    if difference == 0.0:
        return 0.0
    return float(np.sqrt(difference / size)) if size > 0 else float("inf")
