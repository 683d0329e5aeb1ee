"""fp4: 4-bit floats (e2m1: sign, then one of 0, 0.5, 1, 1.5, 2, 3, 4, 6), as Streaming
DiLoCo sends its fragments, in blocks of 512 values that share a scale.

Every byte counts at 4 bits a value, so the scales and the codes are packed tight:

- a block's scale is one byte q: the tensor's unit (its largest magnitude / 6, the one
  float32 of the body) times 2^(-q/8), the smallest such step at or above the block's
  own largest magnitude / 6 (at most 9% above it);
- the codes go two to a byte (low nibble first), and the scale bytes and the codes
  then cross Huffman-coded (raw deflate without string matching) when that is shorter:
  the codes of a real pseudo-gradient are far from uniform (zero is always sent
  positive), so this is about 11% fewer bytes, below the 0.5 a value of the codes alone.

Body: the unit (float32), a mode byte (0: stored, 1: deflated), then the scale bytes
and the codes, stored or deflated.
"""

import zlib

import numpy as np

from pcp_codecs.blocks import padded_rows, step_bound
from pcp_core.codecs import Codec, CodecError

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)
E2M1_MIDPOINTS = (E2M1[1:] + E2M1[:-1]) / 2
# The midpoints are multiples of 1/4: the nearest code of |x| <= 6 is a table lookup
# at floor(4 |x|) (a value on a midpoint goes up, still half a gap away)
E2M1_NEAREST = np.searchsorted(E2M1_MIDPOINTS, np.arange(25) / 4, side="right").astype(np.uint8)
E2M1_SIGNED = np.concatenate([E2M1, -E2M1])  # code: sign << 3 | magnitude index
NEGATIVE_ZERO = 8  # decodes as zero too, but never sent
STEPS_PER_OCTAVE = 8
SCALE_STEPS = 2.0 ** (-np.arange(256) / STEPS_PER_OCTAVE)  # a block's scale / the unit
STORED, DEFLATED = 0, 1


def huffman_coded(payload: bytes) -> bytes:
    """Raw deflate with Huffman coding only (string matches find nothing in codes)."""
    packer = zlib.compressobj(1, zlib.DEFLATED, -15, 9, zlib.Z_HUFFMAN_ONLY)
    return packer.compress(payload) + packer.flush()


def inflated(data: bytes, size: int) -> bytes:
    """Exactly `size` bytes from a raw deflate stream, never more; CodecError otherwise."""
    unpacker = zlib.decompressobj(-15)
    try:
        payload = unpacker.decompress(data, size)
        if not unpacker.eof:  # the end-of-stream code may follow the last byte
            payload += unpacker.decompress(unpacker.unconsumed_tail, 1)
    except zlib.error as error:
        raise CodecError(f"fp4: the deflated codes are corrupt ({error})") from None
    if len(payload) != size or not unpacker.eof or unpacker.unused_data:
        raise CodecError(f"fp4: the deflated codes are not the {size} bytes expected")
    return payload


class Fp4(Codec):
    name = "fp4"
    description = "4-bit floats (e2m1) in blocks of 512 with one-byte scales, Huffman-coded"
    block = 512

    def blocks(self, count: int) -> int:
        return -(-count // self.block)

    def payload_bytes(self, count: int) -> int:
        return self.blocks(count) + -(-count // 2)

    def max_bytes(self, count: int) -> int:
        return 5 + self.payload_bytes(count)

    def scales(self, values: np.ndarray) -> tuple[np.ndarray, np.float32, np.ndarray]:
        """The values in rows of a block, the unit, and each block's scale step q."""
        rows = padded_rows(values, self.block)
        peak = np.abs(rows).max(axis=1, initial=0).astype(np.float64)
        top = peak.max(initial=0)
        with np.errstate(divide="ignore"):
            octaves = np.log2(peak / top) if top > 0 else np.full(peak.shape, -np.inf)
        steps = np.clip(np.floor(-STEPS_PER_OCTAVE * octaves), 0, 255).astype(np.uint8)
        return rows, np.float32(top / 6), steps

    def encode(self, values: np.ndarray) -> bytes:
        rows, unit, steps = self.scales(values)
        scales = block_scales(unit, steps)[:, None]
        rows /= np.where(scales > 0, scales, 1)
        signs = np.signbit(rows).view(np.uint8) << 3
        quarters = np.abs(rows, out=rows)
        quarters *= 4
        codes = E2M1_NEAREST[np.minimum(quarters, 24, out=quarters).astype(np.uint8)] | signs
        codes[codes == NEGATIVE_ZERO] = 0  # zero has no sign: one code fewer to spend bits on
        codes = codes.reshape(-1)[: values.size + values.size % 2]  # pad to whole bytes
        payload = steps.tobytes() + (codes[0::2] | (codes[1::2] << 4)).tobytes()
        packed = huffman_coded(payload)
        mode, body = (DEFLATED, packed) if len(packed) < len(payload) else (STORED, payload)
        return np.float32(unit).astype("<f4").tobytes() + bytes([mode]) + body

    def decode(self, data: bytes, count: int) -> np.ndarray:
        if len(data) < 5:
            raise CodecError(f"fp4: {len(data)} bytes, shorter than the 5 of unit and mode")
        unit = np.frombuffer(data, "<f4", count=1)[0]
        if not (np.isfinite(unit) and unit >= 0):
            raise CodecError("fp4: the unit scale is negative, NaN or infinite")
        size, mode = self.payload_bytes(count), data[4]
        if mode == DEFLATED:
            payload = inflated(data[5:], size)
        elif mode == STORED and len(data) - 5 == size:
            payload = data[5:]
        else:
            raise CodecError(f"fp4: mode {mode} with {len(data) - 5} bytes for {count} values")
        blocks = self.blocks(count)
        packed = np.frombuffer(payload, np.uint8, offset=blocks)
        codes = np.empty(packed.size * 2, np.uint8)
        codes[0::2], codes[1::2] = packed & 0xF, packed >> 4
        if codes.size > count and codes[count]:
            raise CodecError("fp4: the padding nibble after the last value is not zero")
        padded = np.zeros(blocks * self.block, np.float32)
        np.take(E2M1_SIGNED, codes[:count], out=padded[:count], mode="clip")  # unbuffered
        steps = np.frombuffer(payload, np.uint8, count=blocks)
        padded.reshape(blocks, self.block)[...] *= block_scales(unit, steps)[:, None]
        return padded[:count]

    def error_bound(self, values: np.ndarray) -> np.ndarray:
        _, unit, steps = self.scales(values)
        return step_bound(block_scales(unit, steps), 1.0, self.block, values.size)


def block_scales(unit: np.float32, steps: np.ndarray) -> np.ndarray:
    """Each block's float32 scale, the same on both sides of the link."""
    return (np.float64(unit) * SCALE_STEPS[steps]).astype(np.float32)


FP4 = Fp4()
