"""Fuzzing every codec's decoder: bytes from the network, random or mutated encodings.

Whatever the bytes, `decode_tensor` ends in `count` float32 values or a CodecError (no
other exception, no hang) and allocates no more than a few times the values it was
asked for plus the bytes it was given.

    PCP_FUZZ_EXAMPLES=30000 pytest plugins/pcp-codecs/tests/test_fuzz.py   # a long run
    PCP_FUZZ_REPORT=tried.json ...  # writes {test id: inputs tried} when the tests end
"""

import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pcp_core import plugins
from pcp_core.codecs import CodecError, decode_tensor, encode_tensor
from pcp_core.testing.fuzzing import FUZZ, TRIED, report_tried  # noqa: F401 (autouse)

CODECS = ["f32", "bf16", "int8", "fp4", "topk"]
HANG_S = 5.0  # decoding a few thousand values this long is a hang, even on a loaded machine
ALLOCATION_SLACK = 64 * 2**10  # Python objects besides the arrays


def decode_checked(name: str, data: bytes, count: int, test: str) -> None:
    """Decode under the checks of the module docstring."""
    TRIED[f"{test}[{name}]"] += 1
    codec = plugins.host().codec(name)
    tracemalloc.start()
    started = time.monotonic()
    try:
        values = decode_tensor(codec, data, (count,))
    except CodecError:
        values = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.monotonic() - started < HANG_S
    assert peak <= 16 * count + 4 * len(data) + ALLOCATION_SLACK, (count, len(data), peak)
    if values is not None:
        assert values.dtype == np.float32 and values.shape == (count,)


@pytest.mark.parametrize("name", CODECS)
@FUZZ
@given(data=st.data())
def test_codec_decode_random_bytes(name: str, data: st.DataObject) -> None:
    count = data.draw(st.integers(0, 3000))
    longest = plugins.host().codec(name).max_bytes(count) + 9
    body = data.draw(st.binary(max_size=longest))
    decode_checked(name, body, count, "test_codec_decode_random_bytes")


@pytest.mark.parametrize("name", CODECS)
@FUZZ
@given(data=st.data())
def test_codec_decode_mutated_encodings(name: str, data: st.DataObject) -> None:
    count = data.draw(st.integers(0, 3000))
    seed = data.draw(st.integers(0, 2**32 - 1))
    values = np.random.default_rng(seed).standard_normal(count).astype(np.float32)
    encoded = bytearray(encode_tensor(plugins.host().codec(name), values))
    for _ in range(data.draw(st.integers(1, 8))):
        where = data.draw(st.integers(0, len(encoded)))
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip" and where < len(encoded):
            encoded[where] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del encoded[where:]
        else:
            encoded[where:where] = data.draw(st.binary(min_size=1, max_size=16))
    decode_checked(name, bytes(encoded), count, "test_codec_decode_mutated_encodings")
