"""Top-k: the k values of largest magnitude, as ascending uint32 positions then their
float32 values; the rest is left to error feedback (the sender adds it to the tensor's
next value), as DeMo and SparseLoCo send their pseudo-gradients."""

import math

import numpy as np

from pcp_core.codecs import Codec, CodecError

FRACTION = 0.01  # of each tensor's values, at least one


class TopK(Codec):
    name = "topk"
    description = "the 1% largest values with their positions (0.08 bytes a value), rest fed back"
    feedback = True

    def __init__(self, fraction: float = FRACTION) -> None:
        self.fraction = fraction

    def kept(self, count: int) -> int:
        return min(count, max(1, math.ceil(self.fraction * count)))

    def max_bytes(self, count: int) -> int:
        return 8 * self.kept(count)

    def encode(self, values: np.ndarray) -> bytes:
        if values.size >= 2**32:
            raise ValueError(f"topk: {values.size} values do not fit uint32 positions")
        k = self.kept(values.size)
        if k == 0:
            return b""
        chosen = np.sort(np.argpartition(np.abs(values), values.size - k)[values.size - k :])
        return chosen.astype("<u4").tobytes() + values[chosen].astype("<f4").tobytes()

    def decode(self, data: bytes, count: int) -> np.ndarray:
        k = self.kept(count)
        if len(data) != 8 * k:
            raise CodecError(
                f"topk: {len(data)} bytes for {count} values, expected {k} positions and "
                f"values ({8 * k} bytes)"
            )
        positions = np.frombuffer(data, "<u4", count=k).astype(np.int64)
        if k and (positions[-1] >= count or (np.diff(positions) <= 0).any()):
            raise CodecError("topk: positions out of range or not strictly ascending")
        values = np.zeros(count, np.float32)
        values[positions] = np.frombuffer(data, "<f4", offset=4 * k)
        return values

    def error_bound(self, values: np.ndarray) -> np.ndarray:
        return np.abs(values.astype(np.float64))  # a value is sent exactly or not at all


TOPK = TopK()
