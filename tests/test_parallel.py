"""Passes over a model's tensors on several threads (`pcp_core.parallel`): the same
results as one pass, in order, writes reaching the tensors, and clear errors."""

import math
import threading

import numpy as np
import pytest

from pcp_core import parallel
from pcp_core.parallel import all_finite, delta_norm, difference_norm
from pcp_core.shepherd.aggregation import RunningSum


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "PIECE", 1000)  # many pieces from small tensors


def tensors(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal(shape).astype(np.float32) for shape in [(50, 70), (3,), (0,), (2501,)]
    ]


def test_results_come_in_order_tensor_by_tensor_and_piece_by_piece() -> None:
    arrays = tensors(0)
    sizes = parallel.pieces(lambda piece: piece.size, arrays)
    assert sizes == [1000, 1000, 1000, 500, 3, 1000, 1000, 501]


def test_large_passes_go_to_the_pool_and_small_ones_stay_in_the_calling_thread() -> None:
    def where(piece: np.ndarray) -> str:
        return threading.current_thread().name

    assert any(name.startswith("pcp-host") for name in parallel.pieces(where, tensors(0)))
    small = [np.zeros(3999, np.float32)]  # under PARALLEL_FROM pieces' worth
    assert parallel.pieces(where, small) == [threading.current_thread().name] * 4


def test_each_keeps_the_order_on_the_pool_and_stays_here_when_small() -> None:
    def where(item: int) -> tuple[int, str]:
        return item, threading.current_thread().name

    done = parallel.each(where, list(range(20)), elements=4000)  # PARALLEL_FROM pieces
    assert [item for item, _ in done] == list(range(20))
    assert any(name.startswith("pcp-host") for _, name in done)
    here = threading.current_thread().name
    assert parallel.each(where, [1, 2], elements=3999) == [(1, here), (2, here)]


def test_each_passes_an_items_error_on() -> None:
    def fail_on_three(item: int) -> int:
        if item == 3:
            raise ValueError("three")
        return item

    with pytest.raises(ValueError, match="three"):
        parallel.each(fail_on_three, list(range(8)), elements=10**6)


def test_later_runs_on_the_pool_for_a_large_pass_and_here_for_a_small_one() -> None:
    def where() -> str:
        return threading.current_thread().name

    assert parallel.later(where, elements=4000).result().startswith("pcp-host")
    assert parallel.later(where, elements=3999).result() == threading.current_thread().name

    def fail() -> None:
        raise ValueError("here")

    with pytest.raises(ValueError, match="here"):  # handed on by the future, as the pool's
        parallel.later(fail, elements=0).result()


def test_the_norm_is_the_sum_of_the_pieces_in_order_whatever_the_threads() -> None:
    arrays = tensors(1)
    expected = 0.0
    for array in arrays:  # one thread, piece after piece
        flat = array.reshape(-1).astype(np.float64)
        for start in range(0, flat.size, 1000):
            expected += float(np.dot(flat[start : start + 1000], flat[start : start + 1000]))
    assert delta_norm(arrays) == math.sqrt(expected)
    assert all(delta_norm(arrays) == delta_norm(arrays) for _ in range(20))
    others = tensors(2)
    assert difference_norm(arrays, others) == delta_norm(
        [a - b for a, b in zip(arrays, others, strict=True)]
    )


def test_writes_reach_the_tensors() -> None:
    sums = [np.zeros(a.shape, np.float64) for a in tensors(3)]
    total = RunningSum(sums)
    total.add(tensors(3))
    total.add(tensors(4), weight=3)
    for added, once, thrice in zip(sums, tensors(3), tensors(4), strict=True):
        np.testing.assert_array_equal(
            added, once.astype(np.float64) + 3.0 * thrice.astype(np.float64)
        )
    means = [np.empty(a.shape, np.float32) for a in sums]
    total.mean_into(means)
    for mean, added in zip(means, sums, strict=True):
        np.testing.assert_array_equal(mean, (added / 4).astype(np.float32))


def test_one_non_finite_value_in_any_piece_is_found() -> None:
    arrays = tensors(5)
    assert all_finite(arrays)
    arrays[3][2400] = np.nan
    assert not all_finite(arrays)


def test_a_tensor_that_is_not_contiguous_is_refused_not_silently_copied() -> None:
    square = np.zeros((40, 40), np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        parallel.pieces(lambda piece: piece.fill(1), [square.T])
    with pytest.raises(ValueError, match="do not pair up"):
        parallel.pieces(np.copyto, [square], [np.zeros(3, np.float32)])
