"""Conformance suite for aggregators. An aggregator package proves itself in two lines:

    class TestMyAggregator(AggregatorConformance):
        aggregator_name = "mine"

It is registered with a description; every combiner merges identical results into that
result, whatever their weights; it writes every value of its output, finite, of the
output's shape and dtype; it changes neither the results nor its state in `combine`
(a second call gives the same bits), and gives the same bits from a fresh combiner
loaded with its `state`; a fragment (a key with fewer tensors) works beside the whole
model; and, unless it declares `robust = False`, one result a thousand times the others'
size, pointing against them, among five moves the merge by at most 0.6 times its size.
"""

from typing import Any, ClassVar

import numpy as np
import pytest

SHAPES = [(6, 5), (5,), (3, 2, 2)]


def deltas(count: int, seed: int = 0, spread: float = 0.1) -> list[list[np.ndarray]]:
    """`count` results near a common direction, like honest workers' pseudo-gradients."""
    rng = np.random.default_rng(seed)
    common = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]
    return [
        [(c + spread * rng.standard_normal(c.shape)).astype(np.float32) for c in common]
        for _ in range(count)
    ]


def norm(arrays: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(np.square(a, dtype=np.float64)) for a in arrays)))


def empty() -> list[np.ndarray]:
    return [np.full(shape, np.nan, np.float32) for shape in SHAPES]


class AggregatorConformance:
    aggregator_name: ClassVar[str]
    robust: ClassVar[bool] = True  # bounded against a minority of huge results

    @pytest.fixture
    def aggregator(self) -> Any:
        from pcp_core import plugins

        return plugins.host().aggregator(self.aggregator_name)

    def merge(self, combiner: Any, results: list[list[np.ndarray]], weights: Any = None) -> Any:
        out = empty()
        combiner.combine(0, results, weights or [1] * len(results), out)
        return out

    def test_registered(self, aggregator: Any) -> None:
        assert aggregator.name == self.aggregator_name and aggregator.description

    def test_identical_results_merge_into_themselves(self, aggregator: Any) -> None:
        one = deltas(1)[0]
        for weights in ([1, 1, 1], [1, 5, 2]):
            out = self.merge(aggregator.create(), [one, one, one], weights)
            for merged, given in zip(out, one, strict=True):
                np.testing.assert_allclose(merged, given, rtol=1e-6, atol=1e-7)

    def test_a_single_result_is_the_merge(self, aggregator: Any) -> None:
        one = deltas(1, seed=2)[0]
        for merged, given in zip(self.merge(aggregator.create(), [one]), one, strict=True):
            np.testing.assert_allclose(merged, given, rtol=1e-6, atol=1e-7)

    def test_output_is_complete_and_finite(self, aggregator: Any) -> None:
        out = self.merge(aggregator.create(), deltas(4, seed=3), [1, 2, 3, 4])
        for merged, shape in zip(out, SHAPES, strict=True):
            assert merged.shape == shape and merged.dtype == np.float32
            assert np.isfinite(merged).all()

    def test_combine_changes_neither_results_nor_state(self, aggregator: Any) -> None:
        combiner, results = aggregator.create(), deltas(5, seed=4)
        copies = [[a.copy() for a in result] for result in results]
        first, second = self.merge(combiner, results), self.merge(combiner, results)
        for a, b in zip(first, second, strict=True):
            np.testing.assert_array_equal(a, b)
        for result, copy in zip(results, copies, strict=True):
            for a, b in zip(result, copy, strict=True):
                np.testing.assert_array_equal(a, b)

    def test_state_carries_to_a_fresh_combiner(self, aggregator: Any) -> None:
        combiner = aggregator.create()
        for round_index in range(3):
            combiner.accept(0, self.merge(combiner, deltas(4, seed=round_index)))
        again = aggregator.create()
        again.load_state({k: np.array(v) for k, v in combiner.state().items()})
        results = deltas(4, seed=9)
        for a, b in zip(self.merge(combiner, results), self.merge(again, results), strict=True):
            np.testing.assert_array_equal(a, b)

    def test_a_fragment_beside_the_whole_model(self, aggregator: Any) -> None:
        combiner = aggregator.create()
        whole = deltas(3, seed=5)
        combiner.accept(0, self.merge(combiner, whole))
        part = [[result[1]] for result in deltas(3, seed=6)]
        out = [np.full(SHAPES[1], np.nan, np.float32)]
        combiner.combine(1, part, [1, 1, 1], out)
        combiner.accept(1, out)
        assert np.isfinite(out[0]).all()
        assert np.isfinite(self.merge(combiner, whole)[0]).all()

    def test_one_huge_result_moves_the_merge_little(self, aggregator: Any) -> None:
        """(One that declares `robust = False` is moved far: the test says it is not.)"""
        honest = deltas(4, seed=7)
        attacker = [-1000 * array for array in honest[0]]
        reference = self.merge(aggregator.create(), honest)
        attacked = self.merge(aggregator.create(), [*honest, attacker])
        moved = norm([a - r for a, r in zip(attacked, reference, strict=True)])
        robust = moved <= 0.6 * norm(reference)
        assert robust == self.robust, f"one result moved the merge by {moved:.3g}"
