"""Who sent what: each accepted result scored against the round's merge, strikes, and
quarantine.

A robust aggregator bounds what one result can do to a round; it does not say who sent
the bad one, nor stop them from trying every round. So after each round's merge every
result gets a score against what attackers do not control (the robust merge of the same
round, never a window of past results a patient minority fills):

- its norm over its inner steps^0.75 (`step_norm`) against the round's median of those,
  before its tensors are fetched;
- the loss of the model it makes (the round's parameters minus it) on training batches
  drawn anew each round, which no worker can know in advance, against the loss of the
  round's parameters (`gains`): a sign flipped, a random direction, a stale or an
  overgrown result makes the loss worse, where an honest one lowers it as much as the
  others' do (as Templar's validators score a peer's work before it counts);
- its cosine with the merge.

A result whose model does not lower the scoring loss is left out of the round (the merge
is made without it, and its losses do not count); one that lowers it a little counts
for less (`counted_share`); each is one log line naming the worker and why. An honest
worker's model now and then gains nothing on batches outside its shard, so that alone
is no strike. A strike is a result whose gain is under `min_gain` (its model is clearly
worse than the round's parameters), whose cosine is below `min_cosine`, whose ratio is
over `max_norm_ratio`, or that is no well-formed pseudo-gradient (a tensor of another
shape): left out too. A worker with `quarantine_after` strikes within
QUARANTINE_WINDOW rounds is quarantined: disconnected, refused when it comes back, and
listed in summary.json. With the `mean` aggregator, which holds no results, only the
norm is scored; `--result-check none` scores no loss (it costs the shepherd one
evaluation of `--eval-batches` batches per result and round).
Strikes and quarantines are checkpointed (`state`), so a resumed run keeps them.
"""

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from pcp_core.aggregators import Delta
from pcp_core.parallel import pieces

log = structlog.get_logger(__name__)

MIN_COSINE = 0.0
MAX_NORM_RATIO = 4.0
MIN_GAIN = -0.5  # a result whose model makes the scoring loss clearly worse is a strike
FULL_GAIN = 0.5  # a gain under this counts in proportion, none at all from 0 down
QUARANTINE_AFTER = 3
QUARANTINE_WINDOW = 10  # rounds: strikes older than this are forgiven


@dataclass(frozen=True)
class Policy:
    min_cosine: float = MIN_COSINE
    max_norm_ratio: float = MAX_NORM_RATIO
    min_gain: float = MIN_GAIN
    quarantine_after: int = QUARANTINE_AFTER  # 0: never


@dataclass(frozen=True)
class Score:
    cosine: float = math.nan  # with the round's merge (nan: not scored)
    norm_ratio: float = math.nan  # its step norm over the round's median (nan: not scored)
    gain: float = math.nan  # its loss gain over the round's, for its steps (`gains`)

    def problem(self, policy: Policy) -> str | None:
        """Why this result is a strike, or None."""
        if self.gain < policy.min_gain:
            return (
                f"the model it makes gains {self.gain:.3g}x the round's loss gain for its "
                f"steps (at least {policy.min_gain:g}x)"
            )
        if self.cosine < policy.min_cosine:
            return f"cosine with the round's merge {self.cosine:.3f} < {policy.min_cosine:g}"
        if self.norm_ratio > policy.max_norm_ratio:
            return (
                f"norm {self.norm_ratio:.3g}x the round's median (at most "
                f"{policy.max_norm_ratio:g}x)"
            )
        return None


def cosines(deltas: Sequence[Delta], merged: Delta) -> list[float]:
    """Each delta's cosine with `merged`, in float64 (0 where either is zero)."""

    def products(base: np.ndarray, *parts: np.ndarray) -> np.ndarray:
        wide = base.astype(np.float64)
        rows = [
            (np.dot(p.astype(np.float64), wide), np.dot(p, p.astype(np.float64))) for p in parts
        ]
        return np.array([*rows, (np.dot(wide, wide), 0.0)])

    found = pieces(products, merged, *deltas)
    if not found:
        return [0.0] * len(deltas)
    sums = np.sum(found, axis=0)
    own = math.sqrt(sums[-1][0])
    return [
        float(dot / (own * math.sqrt(square))) if own and square else 0.0
        for dot, square in sums[:-1]
    ]


def norm_ratios(step_norms: Sequence[float]) -> list[float]:
    """Each step norm over the median of all (a minority of huge or tiny ones moves the
    median only as far as the nearest honest values)."""
    middle = statistics.median(step_norms)
    return [n / middle if middle > 0 else (math.inf if n > 0 else 1.0) for n in step_norms]


def gains(improvements: Sequence[float], steps: Sequence[int]) -> list[float]:
    """Each result's loss gain (the scoring loss at the round's parameters minus at the
    model its pseudo-gradient makes) over the round's upper median gain, scaled by its
    share of the most inner steps any result ran: honest gains grow with steps, at least
    in proportion to them early on. The upper median is an honest gain or a larger one
    while at most half of the results are bad, so no minority can lower the bar; nan
    (not scored) when the round's upper median gain is not positive."""
    reference = sorted(improvements, reverse=True)[(len(improvements) - 1) // 2]
    if not reference > 0:
        return [math.nan] * len(improvements)
    most = max(steps)
    return [gain / (reference * s / most) for gain, s in zip(improvements, steps, strict=True)]


def counted_share(gain: float) -> float:
    """How much of its weight a result with `gain` counts for in the merge: in full from
    FULL_GAIN (honest results' gains spread about it and above), in proportion below,
    so a result that barely helps (a random direction at the start of a run) barely
    counts; in full where the round was not scored (nan)."""
    if math.isnan(gain):
        return 1.0
    return min(1.0, max(gain, 0.0) / FULL_GAIN)


@dataclass
class Accountability:
    policy: Policy = field(default_factory=Policy)
    strikes: dict[str, list[int]] = field(default_factory=dict)  # name -> rounds struck
    quarantined: dict[str, str] = field(default_factory=dict)  # worker name -> why

    def judge(
        self, round_index: int, names: Sequence[str], scores: Sequence[Score]
    ) -> dict[str, str]:
        """The strikes of a round's results: worker name -> why (the caller logs it, as
        it leaves the result out)."""
        struck = {}
        for name, score in zip(names, scores, strict=True):
            problem = score.problem(self.policy)
            if problem is not None:
                struck[name] = self.strike(round_index, name, problem)
        return struck

    def strike(self, round_index: int, name: str, problem: str) -> str:
        """Count a strike against `name` (quarantining it at `quarantine_after` within
        QUARANTINE_WINDOW rounds, logged here); the problem with the count, for the
        caller's line."""
        recent = [r for r in self.strikes.get(name, []) if r > round_index - QUARANTINE_WINDOW]
        self.strikes[name] = recent = [*recent, round_index]
        after, count = self.policy.quarantine_after, len(recent)
        if after and count >= after and name not in self.quarantined:
            self.quarantined[name] = f"{count} strikes, the last in round {round_index}: {problem}"
            log.warning("worker quarantined", worker=name, round=round_index, strikes=count)
        return f"{problem} (strike {count} in {QUARANTINE_WINDOW} rounds)"

    def is_quarantined(self, name: str) -> str | None:
        reason = self.quarantined.get(name)
        return None if reason is None else f"quarantined: {reason}"

    def state(self) -> dict[str, Any]:
        return {"strikes": dict(self.strikes), "quarantined": dict(self.quarantined)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.strikes = {name: list(rounds) for name, rounds in state.get("strikes", {}).items()}
        self.quarantined = dict(state.get("quarantined", {}))
