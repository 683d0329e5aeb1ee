"""Passes over a model's tensors on several of the host's cores.

numpy and hashlib let go of the GIL inside their loops, so a pass over every tensor of
a model (a shepherd's checks, norms, sums and outer step; a message's seal) runs on a
pool of threads, a piece of at most `PIECE` elements each: GPT-2 small's embedding
alone is a third of the model, and whole tensors would leave the other threads idle.
On one core these passes were a large part of a shepherd's round for GPT-2 small
(docs/wan.md, "Beside the link: a round's own work").

A function given to `pieces` or `each` must not use the pool itself: the pool's threads
would wait on work queued behind them.
"""

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from typing import Any, TypeVar

import numpy as np

PIECE = 1 << 20  # elements of a piece (4 MiB of float32, 8 MiB once in float64)
MAX_THREADS = 8
# Below this many pieces' worth of elements a pass runs in the calling thread: a small
# model's pass takes less than handing it to other threads would.
PARALLEL_FROM = 4

T = TypeVar("T")
A = TypeVar("A")


def threads() -> int:
    """The host pool's threads: one a core, at most MAX_THREADS."""
    return min(MAX_THREADS, os.cpu_count() or 1)


@cache
def pool() -> ThreadPoolExecutor:
    """The host's pool (`threads()` of them)."""
    return ThreadPoolExecutor(threads(), thread_name_prefix="pcp-host")


def pieces(function: Callable[..., T], *tensor_lists: Sequence[np.ndarray]) -> list[T]:
    """`function(a, b, ...)` on each piece of the tensors of `tensor_lists` (lists of
    C-contiguous arrays, the same shapes from one list to the next), side by side; its
    results in order, tensor by tensor and piece by piece. A piece is a flat view, so
    a function that writes into one (`out=`) writes into its tensor."""
    flat = [[_flat(array) for array in arrays] for arrays in tensor_lists]
    jobs, elements = [], 0
    for arrays in zip(*flat, strict=True):
        size = arrays[0].size
        if any(array.size != size for array in arrays):
            raise ValueError(f"tensors of {[a.size for a in arrays]} elements do not pair up")
        elements += size
        for start in range(0, size, PIECE) if size else ():
            jobs.append([array[start : start + PIECE] for array in arrays])
    if elements < PARALLEL_FROM * PIECE:
        return [function(*job) for job in jobs]
    return list(pool().map(lambda job: function(*job), jobs))


def each(function: Callable[[A], T], items: Sequence[A], elements: int) -> list[T]:
    """`function` of each item, side by side on the host's pool, results in order: work
    on whole tensors that does not split into pieces (a codec's encoding of each, or its
    decoding). In this thread where the items hold fewer than PARALLEL_FROM pieces'
    worth of `elements` in all. The largest item bounds the gain: GPT-2's embedding is
    a third of the small model and a twelfth of the large one."""
    if elements < PARALLEL_FROM * PIECE or len(items) < 2:
        return [function(item) for item in items]
    return list(pool().map(function, items))


def later(function: Callable[[], T], elements: int) -> Future[T]:
    """`function()` on the host's pool, its future: one part of a pass over `elements` in
    all that comes part by part (a message's tensors as they are read). Where the whole
    pass holds fewer than PARALLEL_FROM pieces' worth, it runs now, in this thread."""
    if elements >= PARALLEL_FROM * PIECE:
        return pool().submit(function)
    done: Future[T] = Future()
    try:
        done.set_result(function())
    except Exception as error:  # handed on, as the pool's future would
        done.set_exception(error)
    return done


def _flat(array: Any) -> np.ndarray:
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
        raise ValueError("pieces() needs C-contiguous numpy arrays: a flat copy hides writes")
    return array.reshape(-1)


def delta_norm(arrays: list[np.ndarray]) -> float:
    """The norm a worker announces for its pseudo-gradient, summed in float64: float32
    squares overflow to Inf from values of about 1e19, and Inf compares equal to any
    announced Inf-sized norm. Pieces keep the float64 copies
    small; their squares are added in order, so the norm does not depend on threads."""
    return math.sqrt(sum(pieces(_squares, contiguous(arrays))))


def difference_norm(new: list[np.ndarray], old: list[np.ndarray]) -> float:
    """`delta_norm` of new - old, without a model-sized copy of the difference."""
    return math.sqrt(sum(pieces(lambda a, b: _squares(a - b), new, old)))


def _squares(piece: np.ndarray) -> float:
    wide = piece.astype(np.float64)
    return float(np.dot(wide, wide))


def all_finite(arrays: list[np.ndarray]) -> bool:
    finite = pieces(lambda piece: bool(np.isfinite(piece).all()), contiguous(arrays))
    return all(finite)


def contiguous(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Arrays only read, as `pieces` takes them (a copy only of one that is not)."""
    return [np.ascontiguousarray(array) for array in arrays]
