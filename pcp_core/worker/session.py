"""What an algorithm's worker side works with in a round (`WorkerSession`), what it
returns (`RoundWork`), and the inner optimizer state across rounds (`InnerState`): it
lives on the device and is saved after each round (`pcp_core.worker.state`), so a
restarted worker, or a round the shepherd asks for again, starts from the state that
round started from.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from pcp_core.backends import Executor, dispatch
from pcp_core.codecs import Feedback
from pcp_core.program.background import OneInFlight
from pcp_core.wire.downlink import HeldParameters
from pcp_core.wire.messages import Assignment, Tensor, WorkerSettings
from pcp_core.wire.transport import TransportError
from pcp_core.worker.state import InnerStateStore, SavedState

log = structlog.get_logger(__name__)


@dataclass
class WorkerSession:
    """What an algorithm's worker side works with during a round."""

    index: int
    executor: Executor
    corpus: Any  # its training data: the shipped tokens, or its assigned shards
    settings: WorkerSettings
    # In a round that started before its Assignment arrived (pcp_core.worker.overlap):
    # `arrived(wait)` gives that Assignment once it is here (None before, or when not
    # waiting; always None in a round that had it from the start), for the round to
    # fold its tensors in between two calls and take its budget; `wait` blocks until
    # it comes.
    arrived: Callable[[bool], Assignment | None] = field(default=lambda wait: None)
    # The global parameters as this worker last took them in, by parameter: what its
    # pseudo-gradients are measured from (DiLoCo keeps it across rounds). None: none yet.
    anchor: list[np.ndarray] | None = None
    # By parameter, where rounds reported ahead of their answer left it, oldest first:
    # what each next global value of it answers (RunSettings.ahead); DiLoCo keeps it.
    unanswered: dict[int, list[np.ndarray]] = field(default_factory=dict)
    # its copy of the global parameters, which encoded changes are added to
    # (RunSettings.codec_down): Reports hands the round float32 values
    downlink: HeldParameters = field(default_factory=HeldParameters)

    @property
    def algorithm_settings(self) -> Any:
        """What the run's algorithm tells its worker side: its slot of the settings, of
        the type it declares (`Algorithm.worker_settings`), decoded once at the join
        (`pcp_core.worker.joining`); None for an algorithm that declares and sends none."""
        return self.settings.plugins.get(self.settings.algorithm)

    def batches(self, assignment: Assignment, call: int) -> tuple[np.ndarray, np.ndarray]:
        """Deterministic batches from this worker's shard for this round: the round's
        piece of a shipped text corpus, or all of the prepared shards it was given (those
        were shared out at the join)."""
        shipped_whole = self.settings.manifest is None
        return self.corpus.batches(
            "train",
            self.settings.steps_per_call,
            self.settings.batch_size,
            self.settings.block_size,
            stream=(assignment.seed, assignment.round, self.index, call),
            shard=(assignment.shard_index, assignment.shard_count) if shipped_whole else (0, 1),
        )


@dataclass
class RoundWork:
    """What an algorithm's worker side returns for a round."""

    losses: list[float]
    compute_s: float
    tensors: list[Tensor]  # the pseudo-gradient, in the order of the parameter specs


WorkerRound = Callable[[WorkerSession, Assignment], RoundWork]


def steps_from_global(session: WorkerSession, assignment: Assignment) -> RoundWork:
    """The round of an algorithm whose workers train from the global parameters every
    round (federated averaging's, SparseLoCo's): the global parameters the Assignment
    brings (the whole model) into the executor, the round's steps, and how far each
    parameter moved. TransportError for an Assignment without the whole model."""
    executor = session.executor
    given = {tensor.name: tensor.array for tensor in assignment.tensors}
    if set(given) != {spec.name for spec in executor.param_specs}:
        raise TransportError(f"round {assignment.round} came without the whole model")
    start = [given[spec.name] for spec in executor.param_specs]
    executor.set_params(list(start))
    started, losses = time.perf_counter(), []
    for call in range(assignment.inner_steps // session.settings.steps_per_call):
        finished = dispatch(executor, *session.batches(assignment, call))
        losses += [float(loss) for loss in finished()]
    moved = [
        Tensor(spec.name, before - after)
        for spec, before, after in zip(executor.param_specs, start, executor.params(), strict=True)
    ]
    return RoundWork(losses, time.perf_counter() - started, moved)


@dataclass
class InnerState:
    """Which round's end the executor's inner state is, and the saved states behind it.

    In blocking rounds what the codec's error feedback owes (`feedback`, set by
    `pcp_core.worker.reports.Reports`) is saved and restored with the state, so a
    restarted worker, or a refused round, goes on owing what it owed then; under overlap
    a round's result is encoded after its state is saved, and what is owed stays as is.

    A round's state is copied off the device when the round ends (the next round
    changes it there) and written on a thread of its own (`saving`), beside the Result
    and the next round: for GPT-2 small, 1 GB of AdamW moments and a second a round.
    Whatever reads the store first waits for the write in flight; `saved` waits for the
    last one before the worker ends."""

    session: WorkerSession
    store: InnerStateStore
    run_id: str
    after_round: int | None = None  # None: the fresh state from the Setup
    saving: OneInFlight = field(default_factory=lambda: OneInFlight("inner-state"))
    # State tensors that the run sets, by name, over what a saved state holds: the
    # learning-rate schedule (a run resumed with a larger --steps keeps its run id)
    from_setup: dict[str, np.ndarray] = field(default_factory=dict)
    feedback: Feedback | None = None

    def prepare(self, round_index: int) -> None:
        """Make the executor hold the state round `round_index` starts from, if saved.
        A worker that missed rounds goes on from its own last state, as DiLoCo's workers
        do; but where it ran later rounds and the state before this one is gone (pruned,
        or damaged), a warning says the run leaves the trajectory it would have had."""
        if self.after_round == round_index - 1:
            return
        self.saving.wait()
        saved = self.store.load(self.run_id, before_round=round_index)
        newest = self.store.newest_round(self.run_id)
        lost = newest is not None and newest >= round_index
        if lost and (saved is None or saved.round != round_index - 1):
            log.warning(
                "the inner state this round started from is gone; it starts from "
                + ("a fresh one" if saved is None else "an older one")
                + ", so the run is no longer the one it would have been",
                round=round_index,
            )
        if saved is None:
            return
        self.after_round = saved.round
        self._restore(saved)
        log.info("inner state restored", after_round=self.after_round, for_round=round_index)

    def _restore(self, saved: SavedState | None) -> None:
        """Make the executor hold `saved`, and error feedback owe what it owed then (in
        blocking rounds; nothing before the first round's end)."""
        if saved is not None:
            self.session.executor.set_opt_state(self._with_run_settings(saved.arrays))
        if self.feedback is not None and not self.session.settings.overlap:
            owed = {} if saved is None else saved.owed
            self.feedback.residuals = {name: array.copy() for name, array in owed.items()}

    def _with_run_settings(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if not self.from_setup:
            return arrays
        names = [name for name, _, _ in self.session.settings.opt_specs]
        return [self.from_setup.get(n, a) for n, a in zip(names, arrays, strict=True)]

    def finished(self, round_index: int) -> None:
        """Save the state round `round_index` ended with (on the saving thread); in
        blocking rounds, once its result is encoded, with what error feedback owes."""
        self.after_round = round_index
        state = self.session.executor.opt_state()
        keep = self.session.settings.inner_states_kept
        index, owed = self.session.index, None
        if self.feedback is not None and not self.session.settings.overlap:
            owed = {name: array.copy() for name, array in self.feedback.residuals.items()}
        self.saving.submit(
            lambda: self.store.save(self.run_id, index, round_index, state, keep, owed)
        )

    def saved(self) -> None:
        """Wait until the last round's state is written; raise what the write raised."""
        self.saving.wait()

    def refused(self, round_index: int) -> None:
        """The shepherd refused this round's result (NaN, say): the next round starts
        from the state this one started from, not from whatever this round left; it is
        saved again under this round, as if the round had changed nothing (rounds
        reported ahead of it, which went on from its end, are forgotten too)."""
        self.saving.wait()
        self.store.forget_from(round_index)
        self.after_round = None
        saved = self.store.load(self.run_id, before_round=round_index)
        self._restore(saved)
        if saved is not None:
            self.finished(round_index)
