"""Block-scaled codecs: each block of values shares one float32 scale, so one large
value flattens only its block. The body is the scales, then the codes.

`int8`: blocks of 256, codes round(value / scale) with scale = max |value| / 127.
`fp4`: blocks of 64, 4-bit floats (e2m1: sign, then one of 0, 0.5, 1, 1.5, 2, 3, 4, 6)
of value / scale with scale = max |value| / 6, two to a byte, as Streaming DiLoCo
sends its fragments.
"""

import numpy as np

from pcp_core.codecs import Codec, CodecError

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
E2M1_MIDPOINTS = (E2M1[1:] + E2M1[:-1]) / 2
# The midpoints are multiples of 1/4: the nearest code of |x| <= 6 is a table lookup
# at floor(4 |x|) (a value on a midpoint goes up, still half a gap away)
E2M1_NEAREST = np.searchsorted(E2M1_MIDPOINTS, np.arange(25) / 4, side="right").astype(np.uint8)
E2M1_SIGNED = np.concatenate([E2M1, -E2M1])  # code: sign << 3 | magnitude index
# float32 arithmetic on subnormal scales loses their precision: allow for it
SUBNORMAL_SLACK = 2.0**-126


class BlockScaled(Codec):
    """Scales per block of `block` values, then `code_bits` a value."""

    block: int
    code_bits: int
    top: float  # the largest code's magnitude
    widest_gap: float  # between two neighbouring codes, in units of the scale

    def blocks(self, count: int) -> int:
        return -(-count // self.block)

    def code_bytes(self, count: int) -> int:
        return -(-count * self.code_bits // 8)

    def max_bytes(self, count: int) -> int:
        return 4 * self.blocks(count) + self.code_bytes(count)

    def scales(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The values padded into rows of a block, and each row's scale."""
        rows = np.zeros((self.blocks(values.size), self.block), np.float32)
        rows.reshape(-1)[: values.size] = values
        peak = np.abs(rows).max(axis=1, initial=0).astype(np.float64)
        return rows, (peak / self.top).astype(np.float32)

    def encode(self, values: np.ndarray) -> bytes:
        rows, scales = self.scales(values)
        safe = np.where(scales > 0, scales, 1).astype(np.float32)[:, None]
        codes = self.quantise(rows / safe).reshape(-1)[: values.size]
        return scales.astype("<f4").tobytes() + self.pack(codes)

    def decode(self, data: bytes, count: int) -> np.ndarray:
        if len(data) != self.max_bytes(count):
            raise CodecError(
                f"{self.name}: {len(data)} bytes for {count} values, "
                f"expected {self.max_bytes(count)}"
            )
        blocks = self.blocks(count)
        scales = np.frombuffer(data, "<f4", count=blocks)
        if not (np.isfinite(scales).all() and (scales >= 0).all()):
            raise CodecError(f"{self.name}: a block scale is negative, NaN or infinite")
        levels = self.levels(data[4 * blocks :], count)
        padded = np.zeros(blocks * self.block, np.float32)
        padded[:count] = levels
        return (padded.reshape(blocks, self.block) * scales[:, None]).reshape(-1)[:count]

    def error_bound(self, values: np.ndarray) -> np.ndarray:
        _, scales = self.scales(values)
        step = np.repeat(scales.astype(np.float64) * self.widest_gap / 2, self.block)
        # float32 division and rounding widen the step a little
        return step[: values.size] * (1 + 2.0**-12) + SUBNORMAL_SLACK

    def quantise(self, scaled: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def pack(self, codes: np.ndarray) -> bytes:
        raise NotImplementedError

    def levels(self, data: bytes, count: int) -> np.ndarray:
        raise NotImplementedError


class Int8(BlockScaled):
    name = "int8"
    description = "int8 scaled per block of 256 values (1.016 bytes a value)"
    block, code_bits, top, widest_gap = 256, 8, 127.0, 1.0

    def quantise(self, scaled: np.ndarray) -> np.ndarray:
        return np.clip(np.rint(scaled), -127, 127).astype(np.int8)

    def pack(self, codes: np.ndarray) -> bytes:
        return codes.tobytes()

    def levels(self, data: bytes, count: int) -> np.ndarray:
        codes = np.frombuffer(data, np.int8, count=count)
        if (codes == -128).any():
            raise CodecError("int8: code -128 is not used (codes run from -127 to 127)")
        return codes.astype(np.float32)


class Fp4(BlockScaled):
    name = "fp4"
    description = "4-bit floats (e2m1) scaled per block of 64 values (0.5625 bytes a value)"
    block, code_bits, top, widest_gap = 64, 4, 6.0, 2.0

    def quantise(self, scaled: np.ndarray) -> np.ndarray:
        quarters = np.abs(scaled)
        quarters *= 4
        index = E2M1_NEAREST[np.minimum(quarters, 24).astype(np.uint8)]
        return index | (np.signbit(scaled).view(np.uint8) << 3)

    def pack(self, codes: np.ndarray) -> bytes:
        if codes.size % 2:
            codes = np.append(codes, np.uint8(0))
        return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8).tobytes()

    def levels(self, data: bytes, count: int) -> np.ndarray:
        packed = np.frombuffer(data, np.uint8)
        codes = np.empty(packed.size * 2, np.uint8)
        codes[0::2], codes[1::2] = packed & 0xF, packed >> 4
        if codes.size > count and codes[count]:
            raise CodecError("fp4: the padding nibble after the last value is not zero")
        return E2M1_SIGNED[codes[:count]]


INT8 = Int8()
FP4 = Fp4()
