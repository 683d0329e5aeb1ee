"""bfloat16: the top 16 bits of each float32, rounded to nearest even."""

import numpy as np

from pcp_core.codecs import Codec, CodecError

# above this, rounding up could overflow bfloat16's largest value: truncate instead
ROUNDING_LIMIT = np.float32(3.38e38)


class BFloat16(Codec):
    name = "bf16"
    description = "bfloat16, rounded to nearest even (2 bytes a value)"

    def encode(self, values: np.ndarray) -> bytes:
        bits = values.astype(np.float32, copy=False).view(np.uint32)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
        top = np.where(np.abs(values) > ROUNDING_LIMIT, bits >> 16, rounded)
        return top.astype("<u2").tobytes()

    def decode(self, data: bytes, count: int) -> np.ndarray:
        if len(data) != 2 * count:
            raise CodecError(f"bf16: {len(data)} bytes for {count} values, expected {2 * count}")
        top = np.frombuffer(data, "<u2").astype(np.uint32)
        return (top << 16).view(np.float32)

    def max_bytes(self, count: int) -> int:
        return 2 * count

    def error_bound(self, values: np.ndarray) -> np.ndarray:
        magnitude = np.abs(values.astype(np.float64))
        relative = np.where(magnitude > ROUNDING_LIMIT, 2.0**-7, 2.0**-8)
        return magnitude * relative + 2.0**-133  # subnormals: half their fixed step


BFLOAT16 = BFloat16()
