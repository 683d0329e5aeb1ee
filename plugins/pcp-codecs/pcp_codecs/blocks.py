"""Block-scaled int8: each block of 256 values shares one float32 scale (its largest
magnitude / 127), so one large value flattens only its block. The body is the scales,
then one code a value, round(value / scale) in -127..127.
"""

import numpy as np

from pcp_core.codecs import Codec, CodecError

# float32 arithmetic on subnormal scales loses their precision: allow for it
SUBNORMAL_SLACK = 2.0**-126


def padded_rows(values: np.ndarray, block: int) -> np.ndarray:
    """The values in rows of `block`, the last one padded with zeros."""
    rows = np.zeros((-(-values.size // block), block), np.float32)
    rows.reshape(-1)[: values.size] = values
    return rows


def step_bound(scales: np.ndarray, half_gap: float, block: int, count: int) -> np.ndarray:
    """Each value's error bound: half the widest gap between codes, in its block's scale
    (float32 division and rounding widen it a little)."""
    step = np.repeat(scales.astype(np.float64) * half_gap, block)[:count]
    return step * (1 + 2.0**-12) + SUBNORMAL_SLACK


class Int8(Codec):
    name = "int8"
    description = "int8 scaled per block of 256 values (1.016 bytes a value)"
    block = 256

    def blocks(self, count: int) -> int:
        return -(-count // self.block)

    def max_bytes(self, count: int) -> int:
        return 4 * self.blocks(count) + count

    def scales(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = padded_rows(values, self.block)
        peak = np.abs(rows).max(axis=1, initial=0).astype(np.float64)
        return rows, (peak / 127).astype(np.float32)

    def encode(self, values: np.ndarray) -> bytes:
        rows, scales = self.scales(values)
        safe = np.where(scales > 0, scales, 1).astype(np.float32)[:, None]
        codes = np.clip(np.rint(rows / safe), -127, 127).astype(np.int8)
        return scales.astype("<f4").tobytes() + codes.reshape(-1)[: values.size].tobytes()

    def decode(self, data: bytes, count: int) -> np.ndarray:
        if len(data) != self.max_bytes(count):
            raise CodecError(
                f"int8: {len(data)} bytes for {count} values, expected {self.max_bytes(count)}"
            )
        blocks = self.blocks(count)
        scales = np.frombuffer(data, "<f4", count=blocks)
        if not (np.isfinite(scales).all() and (scales >= 0).all()):
            raise CodecError("int8: a block scale is negative, NaN or infinite")
        codes = np.frombuffer(data, np.int8, count=count, offset=4 * blocks)
        if (codes == -128).any():
            raise CodecError("int8: code -128 is not used (codes run from -127 to 127)")
        padded = np.zeros(blocks * self.block, np.float32)
        padded[:count] = codes
        return (padded.reshape(blocks, self.block) * scales[:, None]).reshape(-1)[:count]

    def error_bound(self, values: np.ndarray) -> np.ndarray:
        _, scales = self.scales(values)
        return step_bound(scales, 0.5, self.block, values.size)


INT8 = Int8()
