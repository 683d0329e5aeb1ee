"""`sparse2`: the values of largest magnitude in each chunk of a tensor, 2 bits each,
SparseLoCo's message (Sarfi et al. 2025); the rest goes to error feedback.

A tensor, flattened, is cut into chunks of `chunk` values (the last may be shorter).
Each chunk keeps its `density` share of values (at least one) of largest magnitude; each
kept value becomes a sign and one of the chunk's two magnitudes, the means of the
smaller and the larger half of the kept magnitudes (bfloat16), whichever is nearer.

Body:
- two bfloat16 magnitudes a chunk;
- two bits a kept value, the sign and which magnitude;
- where the kept values are, as the gaps between them in their chunk (the first from
  the chunk's start), Rice-coded: the low `r` bits of each gap here, `r` chosen for the
  mean gap the density implies;
- then the rest of each gap in unary (that many ones, then a zero), padded with ones to
  a whole byte. Only this part's length depends on the values; it is bounded, as the gaps
  of a chunk add up to less than the chunk.
Rice codes are the prefix codes of geometric gaps, which a sparse chunk's are: positions
so coded take about their entropy (docs/sparseloco.md has the bytes).

A decoder refuses any body that is not exactly this: another length, a position past the
end of its chunk, bits set or missing past the end, or a magnitude that is negative or not
finite.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pcp_core.codecs import Codec, CodecError

CHUNK = 4096
DENSITY = 1 / 16
CHUNKS = (64, 2**16)  # the chunk sizes whose gaps' low bits (at most 15) pack in 16 bits
SCALE_BYTES = 4  # two bfloat16 magnitudes a chunk


@dataclass(frozen=True)
class Layout:
    """How a tensor is cut: `full` chunks of `chunk` values keeping `k` each, then a
    chunk of `tail` values keeping `tail_k`."""

    chunk: int
    full: int
    k: int
    tail: int
    tail_k: int

    @property
    def chunks(self) -> int:
        return self.full + (self.tail > 0)

    @property
    def kept(self) -> int:
        return self.full * self.k + self.tail_k

    def chunk_of_each(self) -> np.ndarray:
        """The chunk of each kept value, in order."""
        counts = [self.k] * self.full + [self.tail_k] * (self.tail > 0)
        return np.repeat(np.arange(self.chunks), counts)


class SparseTwoBit(Codec):
    name = "sparse2"
    description = "the largest 1/16 of each chunk of 4,096 values, 2 bits each; the rest fed back"
    feedback = True

    def __init__(self, density: float = DENSITY, chunk: float = CHUNK) -> None:
        if not (isinstance(density, int | float) and 0 < density <= 0.5):
            raise CodecError(f"sparse2: density {density!r} is not a number in (0, 0.5]")
        whole = isinstance(chunk, int | float) and math.isfinite(chunk) and chunk == int(chunk)
        if not (whole and CHUNKS[0] <= chunk <= CHUNKS[1]):
            raise CodecError(f"sparse2: chunk {chunk!r} is not a whole number in {CHUNKS}")
        self.density, self.chunk = float(density), int(chunk)
        mean_gap = (self.chunk - self._keeps(self.chunk)) / self._keeps(self.chunk)
        self.low_bits = int(np.floor(np.log2(max(mean_gap * np.log(2), 1.0))))  # Rice's r

    def tuned(self, options: Mapping[str, float]) -> "SparseTwoBit":
        unknown = set(options) - {"density", "chunk"}
        if unknown:
            raise CodecError(f"sparse2 takes density and chunk, not {', '.join(sorted(unknown))}")
        return SparseTwoBit(options.get("density", self.density), options.get("chunk", self.chunk))

    def _keeps(self, length: int) -> int:
        return min(length, max(1, round(self.density * length))) if length else 0

    def layout(self, count: int) -> Layout:
        full, tail = divmod(count, self.chunk)
        return Layout(self.chunk, full, self._keeps(self.chunk), tail, self._keeps(tail))

    def _fixed_bytes(self, shape: Layout) -> tuple[int, int, int]:
        """The bytes of the magnitudes, the codes and the gaps' low bits."""
        codes = -(-shape.kept * 2 // 8)
        return SCALE_BYTES * shape.chunks, codes, -(-shape.kept * self.low_bits // 8)

    def max_bytes(self, count: int) -> int:
        shape = self.layout(count)
        # a chunk's gaps add up to at most its length less what it keeps
        unary = shape.kept + shape.full * ((shape.chunk - shape.k) >> self.low_bits)
        unary += (shape.tail - shape.tail_k) >> self.low_bits
        return sum(self._fixed_bytes(shape)) + -(-unary // 8)

    def encode(self, values: np.ndarray) -> bytes:
        shape = self.layout(values.size)
        parts = [_encode_block(block, k) for block, k in _blocks(values, shape)]
        scales, gaps, codes = (np.concatenate(p) for p in zip(*parts, strict=True))
        low = gaps & ((1 << self.low_bits) - 1)
        ones = gaps >> self.low_bits
        unary = np.ones(-(-int(ones.sum() + ones.size) // 8) * 8, np.uint8)
        unary[np.cumsum(ones + 1) - 1] = 0  # each gap's ones, then its zero
        return b"".join([
            scales.astype("<u2").tobytes(),
            _pack(codes, 2).tobytes(),
            _pack(low.astype("<u2"), self.low_bits).tobytes(),
            np.packbits(unary, bitorder="little").tobytes(),
        ])  # fmt: skip

    def decode(self, data: bytes, count: int) -> np.ndarray:
        shape = self.layout(count)
        sizes = np.cumsum(self._fixed_bytes(shape))
        if not sizes[-1] <= len(data) <= self.max_bytes(count):
            raise CodecError(
                f"sparse2: {len(data)} bytes for {count} values, expected "
                f"{sizes[-1]} to {self.max_bytes(count)}"
            )
        raw = np.frombuffer(data, np.uint8)
        scales = raw[: sizes[0]].view("<u2").reshape(-1, 2)
        if ((scales & 0x8000) | ((scales & 0x7F80) == 0x7F80)).any():
            raise CodecError("sparse2: a magnitude that is negative or not finite")
        codes = _unpack(raw[sizes[0] : sizes[1]], 2, shape.kept)
        low = _unpack(raw[sizes[1] : sizes[2]], self.low_bits, shape.kept)
        gaps = _ones(raw[sizes[2] :], shape.kept) << self.low_bits
        gaps |= low @ (1 << np.arange(self.low_bits, dtype=np.int64))
        chunk_of = shape.chunk_of_each()
        positions = _positions(gaps, shape)
        levels = _from_bf16(scales)[chunk_of, codes[:, 1].astype(np.intp)]
        values = np.zeros(count, np.float32)
        values[positions + chunk_of * shape.chunk] = np.where(codes[:, 0] == 1, -levels, levels)
        return values

    def error_bound(self, values: np.ndarray) -> np.ndarray:
        # a value left out is off by itself; a kept one by no more than its chunk's
        # largest magnitude (both levels lie between zero and it, rounded to bfloat16)
        magnitude = np.abs(values.astype(np.float64))
        shape = self.layout(values.size)
        padded = np.zeros(shape.chunks * shape.chunk)
        padded[: values.size] = magnitude
        largest = padded.reshape(shape.chunks, shape.chunk).max(axis=1) if values.size else padded
        return np.repeat(largest, shape.chunk)[: values.size] * (1 + 2.0**-7)


def _ones(stream: np.ndarray, count: int) -> np.ndarray:
    """The unary part of `count` gaps: how many ones before each of the first `count`
    zeros; CodecError unless exactly `count` zeros come, then ones to the byte's end."""
    bits = np.unpackbits(stream, bitorder="little")
    zeros = np.flatnonzero(bits == 0)
    end = int(zeros[-1]) + 1 if zeros.size else 0
    if zeros.size != count or stream.size != -(-end // 8):
        raise CodecError(f"sparse2: the gaps' unary part does not end after {count} gaps")
    return np.diff(zeros, prepend=-1) - 1


def _positions(gaps: np.ndarray, shape: Layout) -> np.ndarray:
    """Each kept value's position in its chunk from the gaps before it; CodecError for
    one past the end of its chunk."""
    positions = np.empty_like(gaps)
    cut = shape.full * shape.k
    for part, k, length in ((slice(0, cut), shape.k, shape.chunk),
                            (slice(cut, None), shape.tail_k, shape.tail)):  # fmt: skip
        if k:
            block = np.cumsum(gaps[part].reshape(-1, k) + 1, axis=1) - 1
            if block.size and block[:, -1].max() >= length:
                raise CodecError("sparse2: a position past the end of its chunk")
            positions[part] = block.reshape(-1)
    return positions


def _blocks(values: np.ndarray, shape: Layout) -> list[tuple[np.ndarray, int]]:
    """The full chunks as rows, then the shorter last one, each with how many it keeps."""
    cut = shape.full * shape.chunk
    blocks = [(values[:cut].reshape(shape.full, shape.chunk), shape.k)]
    if shape.tail:
        blocks.append((values[cut:].reshape(1, shape.tail), shape.tail_k))
    return blocks


def _encode_block(block: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of equal chunks: each row's two magnitudes (bfloat16 bits), the gaps before
    each of its k largest values (in increasing order) and their codes (sign, the larger
    magnitude)."""
    length = block.shape[1]
    magnitude = np.abs(block)
    if k < length:
        positions = np.argpartition(magnitude, length - k, axis=1)[:, length - k :]
        positions.sort(axis=1)
    else:
        positions = np.broadcast_to(np.arange(length), block.shape).copy()
    kept = np.take_along_axis(block, positions, axis=1)
    ordered = np.sort(np.abs(kept), axis=1).astype(np.float64)
    half = k // 2
    high = ordered[:, half:].mean(axis=1)
    low = ordered[:, :half].mean(axis=1) if half else high
    scales = _to_bf16(np.stack([low, high], axis=1))
    levels = _from_bf16(scales)
    middle = (levels[:, :1].astype(np.float64) + levels[:, 1:]) / 2
    larger = np.abs(kept) > middle
    codes = np.stack([kept < 0, larger], axis=-1).reshape(-1, 2)
    gaps = np.diff(positions, axis=1, prepend=-1) - 1
    return scales, gaps.reshape(-1).astype(np.int64), codes


def _to_bf16(values: np.ndarray) -> np.ndarray:
    """Finite non-negative values as bfloat16 bits, rounded to nearest (even); one that
    would round up to infinity is cut to the largest bfloat16 instead."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(rounded >= 0x7F80, bits >> 16, rounded).astype(np.uint16)


def _from_bf16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _pack(items: np.ndarray, bits: int) -> np.ndarray:
    """Items (unsigned, under 2**bits; or rows of `bits` booleans) as a little-endian
    stream of `bits` bits each."""
    if items.dtype != np.bool_:
        items = np.unpackbits(items.reshape(-1, 1).view(np.uint8), axis=1, bitorder="little")
    return np.packbits(items[:, :bits].reshape(-1), bitorder="little")


def _unpack(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    """`count` rows of `bits` bits from `_pack`'s stream; CodecError where bits are set
    past them."""
    stream = np.unpackbits(data, bitorder="little")
    if stream[count * bits :].any():
        raise CodecError("sparse2: bits set past the end")
    return stream[: count * bits].reshape(count, bits)


SPARSE2 = SparseTwoBit()
