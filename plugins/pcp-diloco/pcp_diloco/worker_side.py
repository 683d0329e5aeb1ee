"""A DiLoCo round on a worker: inner steps from the global parameters, return the change.

The worker keeps its anchor (`WorkerSession.anchor`): the global parameters as it last
took them in. A round's Assignment carries global parameters, all of them or, with
streaming fragments (`pcp_diloco.fragments`), the fragment the last round synchronised;
the worker takes those as its parameters and its anchor. It then runs the round's steps
and returns the pseudo-gradient anchor − parameters of the fragment this round
synchronises (the whole model without fragments), and takes its parameters there as
that fragment's anchor: with overlapped rounds the next round starts from them at once.

In an overlapped round (`--overlap delayed`, `pcp_core.worker.overlap`) the Assignment
arrives while the steps run: each parameter it carries moves by (new global − anchor)
between two calls and the anchor becomes the new global, which keeps the progress made
since the synchronisation and leaves the pseudo-gradient (anchor − parameters) as it
is. A round that ends before its Assignment waits for it, so every round returns a
pseudo-gradient measured from the global parameters it was assigned; under `--overlap
ahead` it may end first, and the global values that answer it fold in during a later
round, moved by how far they are from where this round left each parameter.

The inner optimizer's state carries over from the worker's last round, but for the
tensors the shepherd names in `DilocoWorkerSettings.zero_at_round_start` (its momentum,
see `DilocoSettings.inner_momentum`): zeroed for the parameters taken in from the
shepherd when they are taken in, at a round's start or at the fold. (Zeroed at the start
of an overlapped round instead, before the fold, the momentum the stale steps built
survived the fold: on loopback, 2 workers, H = 48, seeds 0-2, overlapped rounds ended
11% above blocking ones, and 7.6% with the zeroing at the fold; with 4 fragments 3.1%
and 0.5%.)"""

import time
from collections.abc import Callable

import numpy as np

from pcp_core.engine import (
    Assignment,
    RoundWork,
    Tensor,
    TransportError,
    WorkerSession,
    dispatch,
    set_opt_tensors,
    zero_opt_tensors,
)
from pcp_diloco.fragments import of_round, split
from pcp_diloco.settings import DilocoWorkerSettings


def worker_round(session: WorkerSession, assignment: Assignment) -> RoundWork:
    executor = session.executor
    told: DilocoWorkerSettings = session.algorithm_settings  # decoded once, at the join
    fragments = split([int(np.prod(spec.shape)) for spec in executor.param_specs], told.fragments)
    if assignment.tensors:
        take_in(session, told, assignment.tensors, fold=False)
    elif session.anchor is None:
        raise TransportError(f"round {assignment.round} came without the global parameters")
    if assignment.budget_s > 0:
        start_schedule_at(session, told, schedule_position(assignment))
    steps_per_call = session.settings.steps_per_call
    started, waited = time.perf_counter(), 0.0
    losses: list[float] = []
    steps_run = 0  # queued on the device; `losses` has those whose call has finished
    in_flight: Callable[[], np.ndarray] | None = None  # the call the device is computing
    budget_s = assignment.budget_s  # a speculative round's is the last round's

    def settle() -> None:
        """Wait for the call in flight and keep its losses."""
        nonlocal in_flight
        if in_flight is not None:
            losses.extend(float(v) for v in in_flight())
            in_flight = None

    def fold_in(wait: bool) -> bool:
        """Take in the Assignments that have arrived (`wait`: once the round may end,
        `WorkerSession.arrived`): their tensors, and the round's own budget from here on;
        whether the round's own came."""
        nonlocal budget_s
        came = False
        while (arrived := session.arrived(wait)) is not None:
            take_in(session, told, arrived.tensors, fold=True)
            if arrived.round != assignment.round:  # a round's reported ahead, come first:
                budget_s = arrived.budget_s  # the newest budget there is
                continue
            came, budget_s = True, arrived.budget_s
            if budget_s > 0:  # the speculative round guessed the schedule's place
                start_schedule_at(session, told, schedule_position(arrived) + steps_run)
        return came

    for call in range(assignment.most_steps() // steps_per_call):
        if call and spent(budget_s, time.perf_counter() - started - waited, call):
            # a speculative round does not end on a guessed budget: it waits for the
            # shepherd's Assignment (unless it may end ahead of it) and goes on if that
            # budget has room
            settle()
            waiting = time.perf_counter()
            came = fold_in(True)
            waited += time.perf_counter() - waiting
            if not came or spent(budget_s, time.perf_counter() - started - waited, call):
                break
        # the next call is queued before the last one's losses are read, so an
        # asynchronous device goes from one to the next without waiting for the host
        queued = dispatch(executor, *session.batches(assignment, call))
        steps_run += steps_per_call
        settle()
        in_flight = queued
        fold_in(False)
    settle()
    compute_s = time.perf_counter() - started - waited
    fold_in(True)  # a round that ended before its Assignment: waiting for the network
    # is no compute
    return RoundWork(losses, compute_s, synchronise(session, fragments, assignment.round))


def spent(budget_s: float, elapsed_s: float, calls: int) -> bool:
    """Whether a round with `budget_s` seconds (0: none) stops after `calls` calls: when
    one more call, at their mean time, would overrun the budget by more than half a
    call, so the round ends as near to the budget as whole calls allow. On an
    asynchronous device the clock has seen one call fewer finish than were queued, so its
    round may run one call more."""
    return budget_s > 0 and elapsed_s + elapsed_s / calls / 2 > budget_s


def schedule_position(assignment: Assignment) -> int:
    """Where a budgeted round starts in the run's learning-rate schedule: the shepherd's
    `schedule_step` (the leading worker's steps so far), or round × H from a shepherd
    that gives none."""
    if assignment.schedule_step >= 0:
        return assignment.schedule_step
    return assignment.round * assignment.inner_steps


def start_schedule_at(session: WorkerSession, told: DilocoWorkerSettings, step: int) -> None:
    """Set the inner optimizer's step counters (its learning-rate schedule) to `step`: in
    budgeted rounds the schedule follows the run's position, not this worker's own steps,
    so a slow worker does not lag behind in warm-up and decay."""
    if told.schedule_counters:
        set_opt_tensors(session.executor, dict.fromkeys(told.schedule_counters, step))


def positions(session: WorkerSession, tensors: list[Tensor]) -> tuple[int, ...]:
    """The parameter indices of `tensors`, refusing a name the program does not have."""
    index = {spec.name: i for i, spec in enumerate(session.executor.param_specs)}
    unknown = [t.name for t in tensors if t.name not in index]
    if unknown:
        raise TransportError(f"the shepherd sent parameters the program lacks: {unknown[:3]}")
    return tuple(index[t.name] for t in tensors)


def take_in(
    session: WorkerSession, told: DilocoWorkerSettings, tensors: list[Tensor], fold: bool
) -> None:
    """Take global parameters in as the anchor: as the parameters themselves, or (`fold`)
    moving them by how far the global ones are from the anchor; zero their momentum."""
    where = positions(session, tensors)
    move_in(session, tensors, where, fold)
    zero_momentum(session, told, where)


def move_in(
    session: WorkerSession, tensors: list[Tensor], where: tuple[int, ...], fold: bool
) -> None:
    """Set the parameters `where` to the global values, or (`fold`) move them by how far
    those are from where the round they answer left them: the anchor, or under rounds
    reported ahead the oldest unanswered point, all later points moving alike."""
    executor = session.executor
    whole = len(set(where)) == len(executor.param_specs) and not fold
    if session.anchor is None and not whole:
        raise TransportError("the shepherd sent part of the parameters to a worker without them")
    if whole:  # the whole model, as it is: no need to read the parameters back
        ordered = [np.empty(0)] * len(where)
        for i, tensor in zip(where, tensors, strict=True):
            ordered[i] = tensor.array
        session.anchor = ordered
        session.unanswered.clear()
        executor.set_params(list(ordered))
        return
    anchor = session.anchor
    assert anchor is not None  # a part without an anchor was refused above
    params = executor.params()
    for i, tensor in zip(where, tensors, strict=True):
        points = session.unanswered.pop(i, [])
        if fold:
            shift = tensor.array - (points.pop(0) if points else anchor[i])
            params[i] = params[i] + shift
            points = [point + shift for point in points]
        else:
            params[i], points = tensor.array, []
        anchor[i] = points[-1] if points else tensor.array
        if points:
            session.unanswered[i] = points
    executor.set_params(params)


def zero_momentum(
    session: WorkerSession, told: DilocoWorkerSettings, refreshed: tuple[int, ...]
) -> None:
    """Zero the named inner-state tensors of the parameters just refreshed."""
    if not told.zero_at_round_start:
        return
    specs = session.executor.param_specs
    if len(refreshed) == len(specs):
        zero_opt_tensors(session.executor, set(told.zero_at_round_start))
        return
    suffixes = tuple(f"['{specs[i].name}']" for i in refreshed)
    zero_opt_tensors(
        session.executor, {name for name in told.zero_at_round_start if name.endswith(suffixes)}
    )


def synchronise(
    session: WorkerSession, fragments: list[tuple[int, ...]], round_index: int
) -> list[Tensor]:
    """The pseudo-gradient of the fragment this round synchronises, anchor − parameters;
    the parameters become that fragment's anchor and the newest point whose answer (the
    next global values) is due (`move_in`)."""
    anchor = session.anchor
    assert anchor is not None  # taken in at the round's start
    local = session.executor.params()
    specs = session.executor.param_specs
    pseudo_gradient = []
    for i in fragments[of_round(round_index, len(fragments))]:
        pseudo_gradient.append(Tensor(specs[i].name, anchor[i] - local[i]))
        anchor[i] = local[i]
        session.unanswered.setdefault(i, []).append(local[i])
    return pseudo_gradient
