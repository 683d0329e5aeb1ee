"""Rounds by time (`--round-budget`): how long each worker's round lasts, and how much
each worker's result counts (`--merge`).

Every worker of a budgeted round gets the same duration, so unequal machines report at
about the same time and none idles while the slowest finishes; each runs as many inner
steps as fit (`pcp_diloco.worker_side`) and reports them, one loss a step. Under `auto`
the duration is the time the fastest worker takes for H steps, from the seconds per
step each worker measured in its last rounds (an exponential average: a worker that
slows down, throttled or sharing its machine, or speeds up moves it within a few rounds).
Before any worker has reported, in the run's first round, every worker runs one call:
a short round that measures them all (H steps there would hold the round for the
slowest, which could miss the first round's deadline, three times the first report's
time). A worker that joins later gets the same duration as the others from its first
round.

With `--merge tokens` a pseudo-gradient counts in the round's mean by the steps behind
it (tokens, since every step is one batch): a worker that did a quarter of the work
moves the model a quarter as much as one that did all of it.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from pcp_core.wire.messages import Result
from pcp_diloco.settings import budget_seconds

# The weight of a round's measurement in a worker's seconds-per-step average.
SMOOTHING = 0.5
# The first `auto` round's budget: shorter than any call, so each worker runs one.
MEASURING_S = 1e-3


@dataclass
class RoundBudget:
    """The duration of the next round's budget, learnt from the reports."""

    setting: str  # --round-budget: steps, auto or a duration such as "30s"
    round_steps: int  # H (or H/P with streaming fragments)
    step_s: dict[int, float] = field(default_factory=dict)  # by worker index
    rough: bool = False  # step_s is from `auto`'s first round: replaced, not averaged

    def learn(self, results: dict[int, Result]) -> None:
        """Take in a round's accepted results; the workers absent from it are forgotten,
        so a fast worker that left does not keep the rounds short. The one call of
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
        return MEASURING_S if self.measuring() else self.round_steps * min(self.step_s.values())


def weigh_by(merge: str) -> Callable[[Result], int]:
    """How a result counts in the round's mean under `--merge`: by its steps, or once."""
    if merge == "tokens":
        return lambda result: len(result.losses)
    return lambda result: 1
