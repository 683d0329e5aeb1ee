"""fp4's Huffman-coded body, where the conformance suite does not reach: a deflate
stream from the network inflates to exactly the size the tensor needs, never more."""

import tracemalloc
import zlib

import numpy as np
import pytest
from pcp_codecs.fp4 import DEFLATED, FP4, NEGATIVE_ZERO, STORED

from pcp_core.codecs import CodecError

COUNT = 4096


def body(mode: int, payload: bytes) -> bytes:
    """An fp4 body around `payload`, deflated first when `mode` says so."""
    if mode == DEFLATED:
        packer = zlib.compressobj(9, zlib.DEFLATED, -15)
        payload = packer.compress(payload) + packer.flush()
    return np.float32(1).tobytes() + bytes([mode]) + payload


def test_a_stream_that_inflates_past_the_tensor_is_refused_without_inflating_it() -> None:
    bomb = body(DEFLATED, bytes(64 * 2**20))  # 64 MiB of zeros in about 64 KB
    tracemalloc.start()
    with pytest.raises(CodecError, match=r"not the .* bytes expected"):
        FP4.decode(bomb, COUNT)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2**20


@pytest.mark.parametrize("size", [FP4.payload_bytes(COUNT) - 1, 0])
def test_a_stream_that_inflates_short_of_the_tensor_is_refused(size: int) -> None:
    with pytest.raises(CodecError, match=r"not the .* bytes expected"):
        FP4.decode(body(DEFLATED, bytes(size)), COUNT)


def test_stored_and_deflated_bodies_of_the_same_codes_decode_alike() -> None:
    payload = bytes(FP4.blocks(COUNT)) + bytes(range(256)) * (COUNT // 512)
    stored, deflated = body(STORED, payload), body(DEFLATED, payload)
    np.testing.assert_array_equal(FP4.decode(stored, COUNT), FP4.decode(deflated, COUNT))


def test_real_values_are_huffman_coded_and_zero_is_sent_positive() -> None:
    values = np.random.default_rng(0).standard_normal(COUNT).astype(np.float32)
    values[::3] = -1e-9  # rounds to zero in every block
    data = FP4.encode(values)
    assert data[4] == DEFLATED and len(data) < FP4.max_bytes(COUNT)
    codes = np.frombuffer(zlib.decompress(data[5:], -15), np.uint8)[FP4.blocks(COUNT) :]
    assert not ((codes & 0xF) == NEGATIVE_ZERO).any() and not ((codes >> 4) == NEGATIVE_ZERO).any()
