"""Top-k: about the k values of largest magnitude, as 4-bit floats (`fp4`); what is left
out, the other values and the rounding of the kept ones, goes to error feedback (the
sender adds it to the tensor's next value), as DeMo and SparseLoCo send their
pseudo-gradients.

Body: a bitmap of the kept values (one bit a value, little-endian), then their `fp4`
body. Which values are kept: those at or above the magnitude that a strided sample of at
most 65,536 of the tensor's values puts at the fraction (exact for tensors that small),
never zeros. Finding the exact k-th magnitude of a large tensor is a partition of all of
it, several times slower than the rest of the encoding.

The fraction, half of each tensor, comes from `benchmarks/diloco_quality.py`
(docs/codecs.md): against float32 rounds, 20-round runs lost 36-51% at 1%, up to 3.2% at
30% and 2.1% at 40%, and stayed within 2% at half; DeMo's and SparseLoCo's few percent
pay off over thousands of rounds, not tens.
"""

import numpy as np

from pcp_codecs.blocks import SUBNORMAL_SLACK
from pcp_codecs.fp4 import FP4
from pcp_core.codecs import Codec, CodecError

FRACTION = 0.5  # of each tensor's values
SAMPLE = 2**16  # values the threshold is found among


class TopK(Codec):
    name = "topk"
    description = "the larger half of the values as fp4, with a bitmap of where; the rest fed back"
    feedback = True

    def max_bytes(self, count: int) -> int:
        return -(-count // 8) + FP4.max_bytes(count)

    def encode(self, values: np.ndarray) -> bytes:
        magnitude = np.abs(values)
        sample = magnitude[:: -(-magnitude.size // SAMPLE) or 1]
        kept = np.zeros(values.size, np.bool_)
        if sample.size:
            rank = min(sample.size - 1, int(sample.size * (1 - FRACTION)))
            threshold = max(np.partition(sample, rank)[rank], np.float32(np.finfo(np.float32).tiny))
            kept = magnitude >= threshold
        return np.packbits(kept, bitorder="little").tobytes() + FP4.encode(values[kept])

    def decode(self, data: bytes, count: int) -> np.ndarray:
        start = -(-count // 8)
        if len(data) < start:
            raise CodecError(f"topk: {len(data)} bytes, shorter than the bitmap of {count} values")
        bits = np.unpackbits(np.frombuffer(data, np.uint8, count=start), bitorder="little")
        if bits[count:].any():
            raise CodecError("topk: the bitmap marks values past the end of the tensor")
        kept = bits[:count].view(np.bool_)
        values = np.zeros(count, np.float32)
        values[kept] = FP4.decode(data[start:], int(np.count_nonzero(kept)))
        return values

    def error_bound(self, values: np.ndarray) -> np.ndarray:
        # a value is left out, or rounded to a 4-bit float no further from it than zero is
        magnitude = np.abs(values.astype(np.float64))
        return magnitude * (1 + 2.0**-12) + SUBNORMAL_SLACK


TOPK = TopK()
