"""Who sent what: each accepted result scored against what attackers do not control,
strikes, and quarantine.

A robust aggregator bounds what one result can do to a round; it does not say who sent
the bad one, nor stop them from trying every round. So every result is scored against
the shepherd's own measurements and the robust merge of the same round, never against a
window of past results that a patient minority fills:

- its norm over its inner steps^0.75 (`step_norm`) against the round's median of those,
  before its tensors are fetched;
- what it does to the merge (with three results or more): the loss of the model the
  round's merge makes, on training batches drawn anew each round that no worker can know
  in advance, batch by batch against the loss of the merge made without it (`harm`, a
  paired t statistic): a sign flipped, a stale or an overgrown result makes the merge
  worse beyond doubt, as Templar's validators score a peer's work before it counts. (An
  honest worker's own model, trained on its shard, is often worse than the round's
  parameters on other data; the merge of the workers is not, and one honest result in it
  seldom hurts it);
- its cosine with the merge of the others (the round's merge less its own share, so
  that a result does not vouch for itself: with four workers a random direction has a
  cosine of about 0.4 with a merge it is a quarter of, and about 0 with the others'),
  against the round's own: under MIN_RELATIVE_COSINE times the lower median of the
  round's cosines, which a minority cannot raise past an honest worker's, where that is
  at least AGREEING_COSINE (with three results or more: of two that disagree, there is
  no telling which is wrong);
- whether it is the result its sender sent the round before (`Replays`).

A result without which the merge is better beyond doubt (t over `leave_out_t`) and by a
share of the round's gain that matters (`cost` over `leave_out_cost`: small changes to
the merge are significant on every batch alike) is left out of the round (the merge is
made without it, and its losses do not count); one line names the worker and why. A
strike is one that makes the merge far worse (t over `strike_t`, cost over
`strike_cost`), a cosine with the others' merge below `min_cosine` or below
`min_relative_cosine` of the round's lower median, a norm ratio over
`max_norm_ratio`, a replay of the sender's last result, or a result that is no
well-formed pseudo-gradient (a tensor of another shape): left out too. A worker with
`quarantine_after` strikes within QUARANTINE_WINDOW rounds is quarantined: disconnected,
refused when it comes back, and listed in summary.json. With the `mean` aggregator,
which holds no results, only the norm is scored; `--result-check none` scores no loss
(it costs the shepherd one evaluation of `--eval-batches` batches per result and round,
and needs two or more). Strikes and quarantines are checkpointed (`state`), so a resumed
run keeps them."""

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from pcp_core.aggregators import Delta
from pcp_core.parallel import pieces
from pcp_core.shepherd.robust import lower_median

log = structlog.get_logger(__name__)

MIN_COSINE = 0.0
# Honest workers' cosines with the others' merge fall as their batches shrink and the
# loss flattens. Sixteen workers of two sequences each, the tiny model: 0.96 in round 0,
# 0.2 by round 14, 0.04 by round 29. While the round's typical cosine is at least
# AGREEING_COSINE the honest ones stayed within 0.85 of it, and a result under a quarter
# of it carries little of the work the others agree on; below, the results are mostly
# noise and spread (the lowest a quarter of the typical by round 28): no telling.
MIN_RELATIVE_COSINE = 0.25
AGREEING_COSINE = 0.2
MAX_NORM_RATIO = 4.0
# a result without which the merge's loss is lower by t over LEAVE_OUT_T and by over
# LEAVE_OUT_COST of the round's gain is left out; over STRIKE_T and STRIKE_COST, struck
LEAVE_OUT_T, LEAVE_OUT_COST = 3.0, 0.1
STRIKE_T, STRIKE_COST = 8.0, 0.25
REPEAT_COSINE = 0.999  # a result this close to its sender's last one is a replay
SKETCH_VALUES = 4096  # values of a result kept to compare its sender's next one with
QUARANTINE_AFTER = 3
QUARANTINE_WINDOW = 10  # rounds: strikes older than this are forgiven


@dataclass(frozen=True)
class Policy:
    min_cosine: float = MIN_COSINE
    min_relative_cosine: float = MIN_RELATIVE_COSINE
    max_norm_ratio: float = MAX_NORM_RATIO
    leave_out_t: float = LEAVE_OUT_T
    leave_out_cost: float = LEAVE_OUT_COST
    strike_t: float = STRIKE_T
    strike_cost: float = STRIKE_COST
    quarantine_after: int = QUARANTINE_AFTER  # 0: never


@dataclass(frozen=True)
class Score:
    cosine: float = math.nan  # with the others' merge (nan: not scored)
    norm_ratio: float = math.nan  # its step norm over the round's median (nan: not scored)
    harm: float = math.nan  # how much worse the merge is with it, as a t statistic (`harm`)
    cost: float = math.nan  # the same as a share of the round's loss gain (`cost`)

    def problem(self, policy: Policy, typical_cosine: float = math.nan) -> str | None:
        """Why this result is a strike, or None; `typical_cosine` is the lower median of
        the round's cosines."""
        if self.harm > policy.strike_t and self.cost > policy.strike_cost:
            return (
                f"the merge has a far lower loss without it ({self.cost:.0%} of the round's "
                f"gain, t = {self.harm:.3g})"
            )
        if self.cosine < policy.min_cosine:
            return f"cosine with the others' merge {self.cosine:.3f} < {policy.min_cosine:g}"
        agreeing = typical_cosine >= AGREEING_COSINE
        if agreeing and self.cosine < policy.min_relative_cosine * typical_cosine:
            return (
                f"cosine with the others' merge {self.cosine:.3f}, under "
                f"{policy.min_relative_cosine:g} of the round's typical {typical_cosine:.3f}"
            )
        if self.norm_ratio > policy.max_norm_ratio:
            return (
                f"norm {self.norm_ratio:.3g}x the round's median (at most "
                f"{policy.max_norm_ratio:g}x)"
            )
        return None

    def left_out(self, policy: Policy) -> str | None:
        """Why this result is left out of the round without a strike, or None."""
        if self.harm > policy.leave_out_t and self.cost > policy.leave_out_cost:
            return (
                f"the merge has a lower loss without it ({self.cost:.0%} of the round's "
                f"gain, t = {self.harm:.3g})"
            )
        return None


def sketch(delta: Delta) -> np.ndarray:
    """About SKETCH_VALUES values of a result, spread evenly over its tensors, in float64:
    enough to tell a replayed result from a new one (`Replays`)."""
    total = sum(array.size for array in delta)
    stride = max(1, total // SKETCH_VALUES)
    parts = [np.ravel(array)[::stride] for array in delta]
    return np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)


@dataclass
class Replays:
    """Each sender's last result, sketched: a worker that sends what it sent the round
    before (a lazy worker replaying an old pseudo-gradient instead of training) is found
    by the cosine of the two, over REPEAT_COSINE. Honest results of two rounds differ
    (other data, other parameters); a round run again (a new attempt) gives the same
    result again, which is no replay. Kept by sender and by the part of the model a round
    returns; not checkpointed: a resumed run compares afresh."""

    last: dict[tuple[str, int], tuple[int, np.ndarray]] = field(default_factory=dict)

    def replayed(self, name: str, key: int, round_index: int, delta: Delta) -> float | None:
        """The cosine with `name`'s result of part `key` in an earlier round where over
        REPEAT_COSINE, else None; `delta` becomes its last."""
        now = sketch(delta)
        earlier = self.last.get((name, key))
        self.last[name, key] = (round_index, now)
        if earlier is None or earlier[0] >= round_index or earlier[1].shape != now.shape:
            return None
        before = earlier[1]
        norms = float(np.linalg.norm(now) * np.linalg.norm(before))
        cosine = float(np.dot(now, before) / norms) if norms > 0 else 0.0
        return cosine if cosine > REPEAT_COSINE else None


def cosines(deltas: Sequence[Delta], merged: Delta, shares: Sequence[float]) -> list[float]:
    """Each delta's cosine with the merge of the others, `merged` less the delta's share
    of it (`shares`: what each counted in `merged`, as a fraction of the whole), in
    float64; 0 where either is zero."""

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
    merged_square = sums[-1][0]
    with_others = []
    for (dot, square), share in zip(sums[:-1], shares, strict=True):
        # x · (m - s x) and |m - s x|², from x · m, |x|² and |m|²
        others_dot = dot - share * square
        others_square = merged_square - 2 * share * dot + share * share * square
        norms = math.sqrt(max(others_square, 0.0) * square)
        with_others.append(float(others_dot / norms) if norms > 0 else 0.0)
    return with_others


def norm_ratios(step_norms: Sequence[float]) -> list[float]:
    """Each step norm over the median of all (a minority of huge or tiny ones moves the
    median only as far as the nearest honest values)."""
    middle = statistics.median(step_norms)
    return [n / middle if middle > 0 else (math.inf if n > 0 else 1.0) for n in step_norms]


def cost(before: np.ndarray, with_all: np.ndarray, without: np.ndarray) -> float:
    """What a result costs the merge, as a share of the round's loss gain: (loss with it
    - loss without it) / (loss before the round - loss with it), in means over the
    batches; inf where the merge gains nothing and is worse with it."""
    loss = float(np.mean(with_all) - np.mean(without))
    gain = float(np.mean(before) - np.mean(with_all))
    if gain <= 0:
        return math.inf if loss > 0 else 0.0
    return loss / gain


def harm(base: np.ndarray, trial: np.ndarray) -> float:
    """How much worse the loss of `trial` is than of `base`, batch by batch (each the
    same batches): the paired t statistic of trial - base, positive where it is worse;
    nan with fewer than two batches."""
    differences = np.asarray(trial, np.float64) - np.asarray(base, np.float64)
    if differences.size < 2:
        return math.nan
    spread = float(np.std(differences, ddof=1)) / math.sqrt(differences.size)
    mean = float(np.mean(differences))
    if spread == 0:
        return 0.0 if mean == 0 else math.copysign(math.inf, mean)
    return mean / spread


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
        scored = [s.cosine for s in scores if not math.isnan(s.cosine)]
        typical = lower_median(scored) if scored else math.nan
        for name, score in zip(names, scores, strict=True):
            problem = score.problem(self.policy, typical)
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
