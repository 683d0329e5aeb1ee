"""The aggregators the core ships pass the suite a plugin would, and what each one is for:
centered clipping bounds a result by the honest majority's distances, the coordinate-wise
ones ignore a minority per value, and the scores name what a merge left out."""

import json
import math

import numpy as np
import pytest

from pcp_core import plugins
from pcp_core.shepherd import robust
from pcp_core.shepherd.accountability import (
    SKETCH_VALUES,
    Accountability,
    Policy,
    Replays,
    Score,
    cosines,
    cost,
    harm,
    norm_ratios,
    sketch,
)
from pcp_core.shepherd.robust import lower_median
from pcp_core.testing import AggregatorConformance
from pcp_core.testing.aggregator_suite import SHAPES, deltas, empty


class TestMean(AggregatorConformance):
    aggregator_name = "mean"
    robust = False


class TestCenteredClip(AggregatorConformance):
    aggregator_name = "centered-clip"


class TestTrimmedMean(AggregatorConformance):
    aggregator_name = "trimmed-mean"


class TestMedian(AggregatorConformance):
    aggregator_name = "median"


class TestGeometricMedian(AggregatorConformance):
    aggregator_name = "geometric-median"


def merge(name: str, results: list, weights: list | None = None) -> list[np.ndarray]:
    out = empty()
    plugins.host().aggregator(name).create().combine(0, results, weights or [1] * len(results), out)
    return out


def test_the_mean_weighs_by_weight() -> None:
    a, b = deltas(2, seed=1)
    out = merge("mean", [a, b], [1, 3])
    for merged, x, y in zip(out, a, b, strict=True):
        np.testing.assert_allclose(merged, (x + 3 * y) / 4, rtol=1e-6)


def test_the_mean_is_the_only_one_that_streams() -> None:
    streaming = [a.name for a in plugins.host().registries["aggregator"].values() if a.streams]
    assert streaming == ["mean"]


def test_centered_clip_bounds_two_colluders_of_four_by_the_honest_distances() -> None:
    """Two huge results of four: the lower median of the distances is an honest one, so
    each colluder counts as at most CLIP_FACTOR times it."""
    honest = deltas(2, seed=3)
    colluders = [[1e4 * np.ones_like(a) for a in honest[0]] for _ in range(2)]
    out = merge("centered-clip", [*honest, *colluders])
    size = math.sqrt(sum(float(np.sum(a * a)) for a in out))
    honest_size = math.sqrt(sum(float(np.sum(a * a)) for a in honest[0]))
    assert size < 4 * honest_size, (size, honest_size)


def test_centered_clip_reports_what_each_result_counted() -> None:
    honest = deltas(3, seed=4)
    attacker = [-50 * a for a in honest[0]]
    out = empty()
    combiner = plugins.host().aggregator("centered-clip").create()
    shares = combiner.combine(0, [*honest, attacker], [1, 1, 1, 1], out)
    assert shares is not None and shares[-1] < 0.1 and min(shares[:3]) > 0.9


def test_centered_clip_stops_once_nothing_is_clipped_and_takes_one_result_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Results that all sit within τ of their mean: the mean is where the iterations stay,
    so the first pass over the model that reaches it is the last (the same merge, fewer
    passes); a single result is the merge itself, in one pass."""
    passes: list[int] = []
    combination = robust.combination

    def counted(coefficients, arrays, out) -> None:  # type: ignore[no-untyped-def]
        passes.append(len(arrays))
        combination(coefficients, arrays, out)

    monkeypatch.setattr(robust, "combination", counted)
    results = deltas(3, seed=5)
    out = merge("centered-clip", results)
    for merged, *parts in zip(out, *results, strict=True):
        np.testing.assert_allclose(merged, sum(parts) / 3, rtol=1e-5, atol=1e-7)
    assert len(passes) == 1
    passes.clear()
    (alone,) = deltas(1, seed=6)
    combiner = plugins.host().aggregator("centered-clip").create()
    single = empty()
    assert combiner.combine(0, [alone], [1], single) == [1.0]
    for merged, part in zip(single, alone, strict=True):
        np.testing.assert_array_equal(merged, part)
    assert passes == [1]


def test_the_median_and_trimmed_mean_ignore_a_minority_per_value() -> None:
    values = [[np.full(shape, v, np.float32) for shape in SHAPES] for v in (1, 2, 3, 1e9)]
    assert merge("median", values)[0][0, 0] == 2  # the lower median of 1, 2, 3, 1e9
    assert merge("trimmed-mean", values)[0][0, 0] == 2.5  # 1 and 1e9 trimmed


def test_the_lower_median_stays_with_the_honest_half() -> None:
    assert lower_median([1, 2, 1e9, 1e9]) == 2 and lower_median([5]) == 5


def test_scores() -> None:
    a = [np.ones(shape, np.float32) for shape in SHAPES]
    assert cosines([a, [-x for x in a]], a, [0.0, 0.0]) == pytest.approx([1.0, -1.0])
    assert norm_ratios([1, 1, 1, 10]) == [1, 1, 1, 10]
    policy = Policy(min_cosine=0.0, min_relative_cosine=0.25, max_norm_ratio=4.0)
    assert Score(cosine=-0.5).problem(policy) and Score(norm_ratio=5).problem(policy)
    assert Score(cosine=0.5, norm_ratio=1).problem(policy) is None
    assert Score(cosine=0.1).problem(policy, typical_cosine=0.6)  # far below the round's
    assert Score(cosine=0.2).problem(policy, typical_cosine=0.6) is None
    assert Score(cosine=0.01).problem(policy, typical_cosine=0.06) is None  # mostly noise
    assert Score().problem(policy) is None  # not scored
    assert Score(harm=9, cost=0.5).problem(Policy())
    assert Score(harm=9, cost=0.05).problem(Policy()) is None  # beyond doubt, but small
    assert Score(harm=5, cost=0.5).problem(Policy()) is None
    assert Score(harm=5, cost=0.5).left_out(Policy()) and not Score(harm=2, cost=1).left_out(
        Policy()
    )
    base, merged = np.array([3.0, 3.0]), np.array([2.0, 2.0])  # the round gains 1
    assert cost(base, merged, merged - 0.5) == 0.5 and cost(base, merged, merged + 0.5) == -0.5
    assert cost(merged, base, base - 0.1) == math.inf  # no gain, and worse with it


def test_a_result_does_not_vouch_for_itself() -> None:
    """A random direction, a quarter of a merge of four, has a cosine well above 0.3
    with it (0.4 in the attack runs); with the merge of the three others, about 0."""
    rng = np.random.default_rng(0)
    shared = rng.standard_normal(10_000)
    honest = [shared + 0.5 * rng.standard_normal(shared.size) for _ in range(3)]
    unrelated = rng.standard_normal(shared.size)
    unrelated *= np.linalg.norm(honest[0]) / np.linalg.norm(unrelated)  # at an honest norm
    deltas = [[v.astype(np.float32)] for v in (*honest, unrelated)]
    merged = [np.mean([d[0] for d in deltas], axis=0)]
    with_itself = cosines(deltas, merged, [0.0] * 4)
    with_the_others = cosines(deltas, merged, [0.25] * 4)
    assert with_itself[3] > 0.3 and abs(with_the_others[3]) < 0.05
    assert min(with_the_others[:3]) > 0.7
    others = [np.mean([d[0] for d in deltas[1:]], axis=0)]  # the merge without the first
    assert with_the_others[0] == pytest.approx(cosines(deltas[:1], others, [0.0])[0], rel=1e-5)


def test_harm_is_a_paired_t_statistic() -> None:
    base = np.array([3.0, 2.0, 4.0, 3.5])
    assert harm(base, base + np.array([0.1, 0.12, 0.09, 0.11])) > 10  # worse, beyond doubt
    assert harm(base, base - np.array([0.1, 0.12, 0.09, 0.11])) < -10  # better
    assert abs(harm(base, base + np.array([0.1, -0.1, 0.05, -0.04]))) < 1  # noise
    assert harm(base, base + 0.5) == math.inf and harm(base, base) == 0
    assert math.isnan(harm(base[:1], base[:1] + 1))  # one batch: no spread to go by


def test_strikes_quarantine_and_their_state() -> None:
    books = Accountability(Policy(quarantine_after=2))
    assert books.judge(0, ["a", "b"], [Score(cosine=-1), Score(cosine=1)]) == {
        "a": "cosine with the others' merge -1.000 < 0 (strike 1 in 10 rounds)"
    }
    assert not books.is_quarantined("a")
    books.judge(10, ["a"], [Score(norm_ratio=9)])  # the first is forgiven by now
    assert not books.is_quarantined("a")
    books.judge(11, ["a"], [Score(harm=20, cost=1)])
    assert books.is_quarantined("a") and not books.is_quarantined("b")
    again = Accountability(Policy(quarantine_after=2))
    again.load_state(json.loads(json.dumps(books.state())))  # as a checkpoint keeps it
    assert again.quarantined == books.quarantined and again.strikes == {"a": [10, 11]}
    never = Accountability(Policy(quarantine_after=0))
    for round_index in range(5):
        never.judge(round_index, ["a"], [Score(cosine=-1)])
    assert not never.quarantined


def test_a_replayed_result_is_found() -> None:
    replays = Replays()
    first, second = deltas(2, seed=11)
    assert replays.replayed("w", 0, 0, first) is None  # nothing to compare with yet
    assert replays.replayed("w", 0, 1, second) is None  # a new result
    assert replays.replayed("w", 0, 1, second) is None  # the round run again: no replay
    assert replays.replayed("w", 0, 2, [a.copy() for a in second]) == pytest.approx(1.0)
    assert replays.replayed("v", 0, 3, second) is None  # another sender
    assert replays.replayed("w", 1, 3, second) is None  # another part of the model
    assert sketch(second).size <= 2 * SKETCH_VALUES
