"""Rounds by time (`--round-budget`): how long each worker's round lasts, and how much
each worker's result counts (`--merge`).

Every worker of a budgeted round gets the same duration, so unequal machines report at
about the same time and none idles while the slowest finishes; each runs as many inner
steps as fit (`pcp_diloco.worker_side`) and reports them, one loss a step. Under `auto`
the duration is the time the fastest worker takes for H steps (or the slowest worker's
one call, if that is longer), from the seconds per step each worker measured in its
last rounds (an exponential average: a worker that slows down, throttled or sharing its
machine, or speeds up moves it within a few rounds).
Before any worker has reported, in the run's first round, every worker runs one call:
a short round that measures them all (H steps there would hold the round for the
slowest, which could miss the first round's deadline, three times the first report's
time). A first call warms up (a GPU's ran at 8x its later time a step), so the second
round lasts the slowest worker's one call (at least ROUGH_MIN_S), and the third the
time H steps took in the second. A worker that joins later gets the same duration as
the others from its first round.

With `--merge tokens` a pseudo-gradient counts in the round's mean by the steps behind
it (tokens, since every step is one batch): a worker that did a quarter of the work
moves the model a quarter as much as one that did all of it.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from pcp_core.engine import Result
from pcp_diloco.settings import budget_seconds

# The weight of a round's measurement in a worker's seconds-per-step average.
SMOOTHING = 0.5
# The first `auto` round's budget: shorter than any call, so each worker runs one.
MEASURING_S = 1e-3
# The second's at least: long enough to average a fast worker's warm-up away (an H200's
# GPU ran its second call at 8x its later time a step)
ROUGH_MIN_S = 1.0


@dataclass
class RoundBudget:
    """The duration of the next round's budget, learnt from the reports."""

    setting: str  # --round-budget: steps, auto or a duration such as "30s"
    round_steps: int  # H (or H/P with streaming fragments)
    steps_per_call: int  # a worker stops between calls: its budget is met in whole calls
    step_s: dict[int, float] = field(default_factory=dict)  # by worker index
    # step_s is from `auto`'s first round: replaced, not averaged; the round it sizes
    # (the slowest worker's one call) is, like the first, no reference for the size of
    # later outer steps (`pcp_core.shepherd.step_guard`)
    rough: bool = False

    def learn(self, results: dict[int, Result]) -> None:
        """Take in a round's reports (refused ones too: a worker whose result was refused
        still ran at its speed); the workers absent from it are forgotten, so a fast
        worker that left does not keep the rounds short. The one call of
        `auto`'s first round, slowed by warming up, only stands in until a full round."""
        rough, self.rough = self.rough, self.measuring()
        measured = {
            worker: result.compute_s / len(result.losses)
            for worker, result in results.items()
            if result.losses
        }
        self.step_s = {
            worker: seconds
            if worker not in self.step_s or rough
            else SMOOTHING * seconds + (1 - SMOOTHING) * self.step_s[worker]
            for worker, seconds in measured.items()
        }

    def measuring(self) -> bool:
        """Whether the next round is `auto`'s first, one call each: its outer step is
        no reference for the size of later ones (`pcp_core.shepherd.step_guard`)."""
        return self.setting == "auto" and not self.step_s

    def seconds(self) -> float:
        """The next round's budget in seconds; 0: a round of H steps for everyone."""
        fixed = budget_seconds(self.setting)
        assert fixed is not None, "checked with the settings"
        if fixed >= 0:
            return fixed
        if self.measuring():
            return MEASURING_S
        calls = [seconds * self.steps_per_call for seconds in self.step_s.values()]
        if self.rough:  # one call, warming up, is no measure of H steps: a GPU's first
            return max(*calls, ROUGH_MIN_S)  # took 0.1 s a step, its later ones 0.012 s
        # never shorter than the slowest worker's one call, which it runs whatever the
        # budget: a shorter round would end for the others while it still computes
        return aligned(max(self.round_steps * min(self.step_s.values()), *calls), calls)


def aligned(target_s: float, call_s: list[float]) -> float:
    """The budget near `target_s` (within a quarter, or the slowest worker's whole calls
    either side of it) at which workers with calls of `call_s` seconds end closest
    together. Each stops at the multiple of its call time
    nearest the budget, so the round ends at the latest of those while the others
    idle: on three workers of 1, 2 and 4 times a call's time, a budget of the fastest
    one's H steps left the slowest up to half its (long) call early or late, the others
    idle up to that long (utilisation 88-91%)."""

    def ends(budget: float) -> list[float]:  # as pcp_diloco.worker_side.spent stops
        return [max(math.floor(budget / call + 0.5), 1) * call for call in call_s]

    def idle(budget: float) -> float:
        finished = ends(budget)
        return sum(max(finished) - end for end in finished) / max(finished)

    candidates = {
        max(round(target_s / call) + shift, 1) * call for call in call_s for shift in (-1, 0, 1)
    }
    near = [b for b in candidates if 0.75 * target_s <= b <= 1.25 * target_s]
    # and the slowest worker's whole calls on either side, however far: its calls may be
    # too long for any multiple to fall near (a CPU's 1.6 s beside a GPU's 2.4 s round)
    longest = max(call_s)
    below = max(math.floor(target_s / longest), 1) * longest
    near += [b for b in (below, below + longest) if b <= 2 * target_s]
    near = near or [target_s]
    return min(near, key=lambda budget: (round(idle(budget), 3), abs(budget - target_s)))


def weigh_by(merge: str) -> Callable[[Result], int]:
    """How a result counts in the round's mean under `--merge`: by its steps, or once."""
    if merge == "tokens":
        return lambda result: len(result.losses)
    return lambda result: 1
