"""DiLoCo's outer step on the shepherd, one round at a time: the parameters split into
streaming fragments, one outer optimizer per fragment, the plain average of the first
rounds (`--outer-warmup-rounds`), and a round whose implausible outer step is rolled
back and run again without the results that caused it (`guarded_round`)."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from pcp_core.engine import (
    Assignment,
    CheckpointError,
    ConfigError,
    OuterStep,
    Result,
    RoundOutcome,
    Scope,
    Shepherd,
    StepGuard,
    outliers,
    step_norm,
)
from pcp_diloco.fragments import split

log = structlog.get_logger(__name__)


def split_fragments(setup: Any, count: int) -> list[tuple[int, ...]]:
    """The parameter indices of each streaming fragment (`pcp_diloco.fragments`)."""
    sizes = [int(np.prod(spec.shape)) for spec in setup.program.param_specs]
    try:
        return split(sizes, count)
    except ValueError as error:
        raise ConfigError(f"diloco.{error}") from None


class FragmentSteps:
    """One outer optimizer per fragment, over that fragment's parameters: a fragment's
    momentum moves only when the fragment is synchronised. With one fragment its state
    is the outer optimizer's own (checkpoints read as before fragments existed)."""

    def __init__(
        self, parts: list[list[np.ndarray]], create: Callable[[list[np.ndarray]], OuterStep]
    ) -> None:
        self.steps = [create(part) for part in parts]

    def _prefix(self, index: int) -> str:
        return "" if len(self.steps) == 1 else f"fragment{index}."

    def state(self) -> dict[str, np.ndarray]:
        return {
            self._prefix(i) + name: array
            for i, step in enumerate(self.steps)
            for name, array in step.state().items()
        }

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        for i, step in enumerate(self.steps):
            prefix = self._prefix(i)
            names = step.state().keys()
            missing = [prefix + name for name in names if prefix + name not in state]
            if missing:
                raise CheckpointError(
                    f"the checkpoint has no outer state {missing[0]!r}: was it saved with "
                    f"another diloco.fragments than {len(self.steps)}?"
                )
            step.load_state({name: state[prefix + name] for name in names})


@dataclass
class OuterUpdate:
    """The outer step of a fragment: the plain average of the workers' models for its
    first `warmup_rounds` synchronisations, the outer optimizer's step after."""

    step: OuterStep
    warmup_rounds: int

    def __call__(self, sync: int, params: list[np.ndarray], delta: list[np.ndarray]) -> None:
        if sync < self.warmup_rounds:
            for theta, mean in zip(params, delta, strict=True):
                theta -= mean
        else:
            self.step(params, delta)


@dataclass
class FragmentRound:
    """What a round synchronises (the whole model, or one fragment) and how: its scope,
    the fragment's outer step and guard, and how many times the fragment was
    synchronised before."""

    scope: Scope
    outer: OuterUpdate
    guard: StepGuard
    sync: int
    # whether its pseudo-gradients span all of H's inner steps: a fragment's first
    # synchronisation, in round f < P - 1, spans f + 1 shares of H/P
    full_period: bool

    def part(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        return [arrays[i] for i in self.scope.returned or range(len(arrays))]


def guarded_round(
    shepherd: Shepherd,
    round_: FragmentRound,
    index: int,
    params: list[np.ndarray],
    delta: list[np.ndarray],
    assignment: Callable[[int], Assignment],
    weigh: Callable[[Result], int],
) -> RoundOutcome:
    """Run round `index` and apply its outer step, unless the guard finds the step
    implausible (`pcp_core.shepherd.step_guard`): then it is undone and the round runs again
    without the results that caused it, named in a warning. A step that no single
    result explains means the run diverged: FloatingPointError, before any checkpoint."""
    excluded: dict[str, str] = {}
    attempt = 0
    mine, guard, step = round_.part(params), round_.guard, round_.outer.step
    while True:
        outcome = shepherd.run_round(
            index, params, delta, assignment, excluded, attempt, round_.scope, weigh
        )
        guard.keep(mine, step.state())
        round_.outer(round_.sync, mine, round_.part(delta))
        problem = guard.judge(mine, reference=round_.full_period)
        if problem is None:
            return outcome
        guard.restore(mine, step)
        shepherd.rolled_back()
        norms = {outcome.senders[w]: step_norm(result) for w, result in outcome.results.items()}
        culprits = [name for name in outliers(norms) if name not in excluded]
        if not culprits:
            raise FloatingPointError(
                f"round {index}: {problem}; the run diverged: lower --lr or --outer-lr"
            )
        log.warning(
            "outer step rolled back; running the round again without the results that caused it",
            round=index,
            reason=problem,
            dropped=culprits,
        )
        excluded |= {name: f"its result made {problem} in round {index}" for name in culprits}
        attempt = outcome.attempt + 1
