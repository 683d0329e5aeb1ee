"""Result aggregation: which pseudo-gradients count, and summing them in bounded memory.

A worker first reports a `Result` (losses and the norm of its pseudo-gradient); the
shepherd checks it (`check_result`, `NormBound`) and only then fetches the tensors
(where deltas are pushed, `RunSettings.push_deltas`, they are read as they come, one
buffer per worker, and dropped unread into the sum if their Result is refused). Each
`Delta` is read into one of a few staging buffers (`StagingPool`), checked there (every
tensor present with the right name, shape and dtype, all finite, its norm the one
announced) and only then added into the running sum. A worker that fails mid-transfer,
or sends anything wrong, costs its own buffer and nothing else.

The sum is kept in float64. Deltas arrive in whatever order the network gives, and a
float32 sum of more than two depends on that order: the same command with the same
seed and four workers ended 0.4% apart after 1000 steps (0.2898 and 0.2887). In
float64 the sum of a round's float32 deltas is exact unless their magnitudes differ by
more than about 2^27, so it rounds to the same float32 mean whatever the order.

Memory on the shepherd: the global parameters, the float64 sum (two copies' worth), the
float32 mean, the outer optimizer's state (one copy for Nesterov), and
`STAGING_BUFFERS` staging copies: seven model copies' worth with Nesterov, whatever the
number of workers; nine with the outer-step guard's copy of the parameters and momentum
from before the last step (`pcp_core.shepherd.step_guard`).
"""

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent import futures
from concurrent.futures import Future
from contextlib import contextmanager

import numpy as np

from pcp_core.codecs import Codec, CodecError, decode_tensor, max_encoded_bytes
from pcp_core.parallel import all_finite, contiguous, delta_norm, later, pieces
from pcp_core.program.build import TensorSpec
from pcp_core.wire.messages import Result
from pcp_core.wire.transport import TensorHeader, TransportError

STAGING_BUFFERS = 2  # deltas received at once; the others wait for a free buffer
NORM_RATIO = 10.0  # a norm over 10x the median of the reference norms is refused
STEP_NORM_POWER = 0.75  # norms compare over steps^this (`step_norm`)
NORM_REFERENCE_ROUNDS = 3  # accepted norms of this many earlier rounds count as reference
MIN_REFERENCE_NORMS = 3  # below this many reference norms, no norm is refused
NORM_MATCH = 1e-3  # relative tolerance between the announced and the actual norm


class BadResult(ValueError):
    """A result that must not reach the global parameters; the message says why."""


class NonFinite(BadResult):
    """A result holding NaN or Inf: a diverging worker, or a broken one."""


class MalformedDelta(TransportError):
    """A delta whose tensors are not the model's: refused mid-frame, so the transport
    closes the connection (the stream is no longer at a frame boundary)."""


def check_result(result: Result, round_index: int, attempt: int) -> None:
    """A Result's metadata: for this round and attempt, finite."""
    if (result.round, result.attempt) != (round_index, attempt):
        raise BadResult(
            f"stale result: for round {result.round} attempt {result.attempt}, "
            f"this is round {round_index} attempt {attempt}"
        )
    if not math.isfinite(result.norm) or not all(math.isfinite(v) for v in result.losses):
        raise NonFinite(f"non-finite result (norm {result.norm}, losses {result.losses[-3:]})")
    if not result.losses:
        raise BadResult("a result without losses")
    if result.norm < 0:
        raise BadResult(f"a negative norm: {result.norm}")
    timings = (result.compute_s, result.waited_s, result.sent_s)
    if not all(math.isfinite(t) and t >= 0 for t in timings):
        raise BadResult(f"impossible timings (compute, waited, sent): {timings}")


def step_norm(result: Result) -> float:
    """A result's pseudo-gradient norm over (its inner steps)^STEP_NORM_POWER: what
    `NormBound` compares, so that workers that ran very different numbers of steps in a
    round by time (a GPU's 800 beside a CPU's 2) compare fairly. An honest norm grows as
    steps^q, q between 1/2 (steps in random directions) and 1 (all one way); dividing by
    steps^(3/4) leaves two honest results at most (ratio of steps)^(1/4) apart either
    way: 4.5x for 400x the steps, inside the bound. Measured on an H200: 800 steps 60
    against 10 steps 1.9 early in a run (q 0.8), 350 steps 27 against 2 steps 2.2 later
    (q 0.5); per step, the 2-step results were refused."""
    return result.norm / len(result.losses) ** STEP_NORM_POWER


class NormBound:
    """Refuses a norm far above the others': over NORM_RATIO times the median of the
    norms accepted in the last NORM_REFERENCE_ROUNDS rounds and this round's announced
    ones (each over its steps^STEP_NORM_POWER: `step_norm`). The median ignores a
    minority of outliers, so a few bad workers cannot move the bound; with fewer than
    MIN_REFERENCE_NORMS reference norms (a first round with one or two workers) nothing
    is refused, since there is no telling who is the outlier."""

    def __init__(self, ratio: float = NORM_RATIO) -> None:
        self.ratio = ratio
        self._history: deque[list[float]] = deque(maxlen=NORM_REFERENCE_ROUNDS)

    def limit(self, announced: list[float]) -> float | None:
        reference = [n for norms in self._history for n in norms] + announced
        if len(reference) < MIN_REFERENCE_NORMS:
            return None
        return self.ratio * statistics.median(reference)

    def check(self, norm: float, limit: float | None) -> None:
        if limit is not None and norm > limit:
            raise BadResult(
                f"pseudo-gradient norm over steps^{STEP_NORM_POWER:g} {norm:.4g} is over "
                f"{self.ratio:g}x the median of the others' ({limit / self.ratio:.4g})"
            )

    def remember(self, accepted: list[float]) -> None:
        if accepted:
            self._history.append(accepted)

    def forget_last(self) -> None:
        """Drop the last round's norms: its outer step was rolled back."""
        if self._history:
            self._history.pop()


class StagingPool:
    """A few model-sized buffers that deltas are received into, one per transfer."""

    def __init__(self, specs: list[TensorSpec], count: int = STAGING_BUFFERS) -> None:
        self.specs, self.count = specs, count
        self._free: deque[list[np.ndarray]] = deque(
            [np.empty(s.shape, s.dtype) for s in specs] for _ in range(count)
        )
        self._available = threading.Semaphore(count)
        self._lock = threading.Lock()

    @contextmanager
    def buffer(self) -> Iterator[list[np.ndarray]]:
        self._available.acquire()
        with self._lock:
            arrays = self._free.popleft()
        try:
            yield arrays
        finally:
            with self._lock:
                self._free.append(arrays)
            self._available.release()


class DeltaSink:
    """A `TensorSink` that reads a Delta's tensors into a staging buffer, in spec order.

    Under a codec (`RunSettings.codec` other than f32) each tensor comes as the bytes of
    its encoding, at most as many as the codec may take for it; they are decoded into
    the staging buffer on the host's cores while the next ones are read, and bytes that
    decode to nothing make the delta malformed (raised when the last tensor is read)."""

    def __init__(
        self, arrays: list[np.ndarray], specs: list[TensorSpec], codec: Codec | None = None
    ) -> None:
        self.arrays, self.specs, self.codec = arrays, specs, codec
        self.filled_count = 0
        self.received_bytes = 0  # the tensors as they crossed the link
        self.decode_s = 0.0  # the receiving thread's time on decoding (its waits included)
        self._elements = sum(math.prod(spec.shape) for spec in specs)
        self._decoding: list[Future[None]] = []
        self._failed = False  # a decoding failed: raised at the next tensor

    def buffer(self, index: int, header: TensorHeader) -> np.ndarray:
        spec = self.specs[index] if index < len(self.specs) else None
        if spec is None or header.name != spec.name:
            raise MalformedDelta(
                f"unexpected tensor {header.name}"
                + ("" if spec is None else f", expected {spec.name}")
            )
        if self.codec is None:
            if (header.shape, header.dtype) != (spec.shape, spec.dtype):
                raise MalformedDelta(
                    f"unexpected tensor {header.name} {header.shape} {header.dtype}, "
                    f"expected {spec.name} {spec.shape}"
                )
            return self.arrays[index]
        limit = max_encoded_bytes(self.codec, spec.shape)
        if header.dtype != "uint8" or len(header.shape) != 1 or header.shape[0] > limit:
            raise MalformedDelta(
                f"tensor {header.name} is {header.dtype} {header.shape}, not a {self.codec.name} "
                f"encoding (uint8, at most {limit} bytes)"
            )
        return np.empty(header.shape, np.uint8)

    def filled(self, index: int, header: TensorHeader, array: np.ndarray) -> None:
        self.received_bytes += array.nbytes
        self.filled_count += 1
        if self.codec is None:
            return
        started = time.perf_counter()
        decoding = later(lambda: self._decode(index, header, array), self._elements)
        decoding.add_done_callback(self._note_failure)
        self._decoding.append(decoding)
        if self._failed or self.filled_count == len(self.specs):  # the last: wait for all
            self.settle()
            for decoding in self._decoding:
                decoding.result()
        self.decode_s += time.perf_counter() - started

    def _note_failure(self, decoding: Future[None]) -> None:
        self._failed = self._failed or decoding.exception() is not None

    def settle(self) -> None:
        """Wait until no decoding writes into the arrays any more (a delta cut short, or
        refused, leaves its buffer only after this)."""
        futures.wait(self._decoding)

    def _decode(self, index: int, header: TensorHeader, array: np.ndarray) -> None:
        assert self.codec is not None
        try:
            decoded = decode_tensor(self.codec, array.tobytes(), self.specs[index].shape)
        except CodecError as error:
            raise MalformedDelta(f"tensor {header.name}: {error}") from error
        np.copyto(self.arrays[index], decoded)


class DrainSink:
    """A `TensorSink` for a Delta that is not wanted (pushed after a Result computed
    ahead of an Assignment that did not continue it, `RunSettings.ahead`): each tensor
    is read into scratch memory and dropped, checked as `DeltaSink` checks it, against
    the spec of the parameter it names."""

    def __init__(self, specs: list[TensorSpec], codec: Codec | None = None) -> None:
        self.specs, self.codec = {spec.name: spec for spec in specs}, codec

    def buffer(self, index: int, header: TensorHeader) -> np.ndarray:
        spec = self.specs.get(header.name)
        if spec is None or index >= len(self.specs):
            raise MalformedDelta(f"unexpected tensor {header.name}")
        return DeltaSink([np.empty(spec.shape, spec.dtype)], [spec], self.codec).buffer(0, header)

    def filled(self, index: int, header: TensorHeader, array: np.ndarray) -> None:
        pass


def check_delta(arrays: list[np.ndarray], received: int, announced_norm: float) -> None:
    """A received pseudo-gradient: complete, finite, with the norm its Result announced."""
    if received != len(arrays):
        raise BadResult(f"incomplete result: {received} of {len(arrays)} tensors")
    if not all_finite(arrays):
        raise NonFinite("pseudo-gradient holds NaN or Inf")
    norm = delta_norm(arrays)
    if abs(norm - announced_norm) > NORM_MATCH * max(norm, announced_norm, 1e-30):
        raise BadResult(
            f"pseudo-gradient norm {norm:.6g}, but its result announced {announced_norm:.6g}"
        )


class RunningSum:
    """The sum of the accepted deltas of a round, added one whole delta at a time into
    float64 `sums` (see the module's docstring), and their float32 mean."""

    def __init__(self, sums: list[np.ndarray]) -> None:
        if any(total.dtype != np.float64 for total in sums):
            raise TypeError("a round's sum is float64, so it does not depend on arrival order")
        self.sums = sums
        self.weight = 0
        self._lock = threading.Lock()
        for total in sums:
            total.fill(0)

    def add(
        self,
        arrays: list[np.ndarray],
        indices: Sequence[int] | None = None,
        weight: int = 1,
        worker: int = -1,
    ) -> None:
        """Add a delta holding the parameters `indices` (None: all of them), `weight`
        times (an integer: a float32 times it is exact in float64); the other
        parameters' sums stay as they are. The sum does not ask who sent it."""
        if indices is None:
            indices = range(len(self.sums))
        if weight < 1:
            raise ValueError(f"a delta's weight is a positive integer, not {weight}")
        times = np.float64(weight)
        with self._lock:
            pieces(
                lambda total, piece: np.add(total, piece if weight == 1 else times * piece, total),
                [self.sums[index] for index in indices],
                contiguous(arrays),
            )
            self.weight += weight

    def mean_into(self, means: list[np.ndarray]) -> None:
        """The weighted mean of the deltas added, rounded into the float32 arrays `means`."""
        scale = 1.0 / self.weight
        pieces(
            lambda total, mean: np.multiply(total, scale, mean, casting="same_kind"),
            self.sums,
            means,
        )


class HeldResults:
    """The accepted deltas of a round, each copied out of its staging buffer, for an
    aggregator that needs them all at once (`pcp_core.aggregators`): one copy of the
    round's parameters a worker."""

    def __init__(self) -> None:
        self.deltas: dict[int, list[np.ndarray]] = {}
        self.weights: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(
        self,
        arrays: list[np.ndarray],
        indices: Sequence[int] | None = None,
        weight: int = 1,
        worker: int = -1,
    ) -> None:
        copies = [np.array(array, copy=True) for array in arrays]
        with self._lock:
            self.deltas[worker], self.weights[worker] = copies, weight
