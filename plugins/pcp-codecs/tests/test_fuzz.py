"""Fuzzing every codec's decoder: bytes from the network, random or mutated encodings.

Whatever the bytes, `decode_tensor` ends in `count` float32 values or a CodecError (no
other exception, no hang) and allocates no more than a few times the values it was
asked for plus the bytes it was given.

    PCP_FUZZ_EXAMPLES=30000 pytest plugins/pcp-codecs/tests/test_fuzz.py   # a long run
    PCP_FUZZ_REPORT=tried.json ...  # writes {test id: inputs tried} when the tests end
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pcp_core import plugins
from pcp_core.codecs import Codec, encode_tensor
from pcp_core.testing.fuzzing import (  # noqa: F401 (report_tried: autouse)
    FUZZ,
    decode_checked,
    mutated,
    report_tried,
)

CODECS = ["f32", "bf16", "int8", "fp4", "topk"]


def codec_of(name: str) -> Codec:
    return plugins.host().codec(name)


@pytest.mark.parametrize("name", CODECS)
@FUZZ
@given(data=st.data())
def test_codec_decode_random_bytes(name: str, data: st.DataObject) -> None:
    count = data.draw(st.integers(0, 3000))
    longest = codec_of(name).max_bytes(count) + 9
    body = data.draw(st.binary(max_size=longest))
    decode_checked(codec_of(name), body, count, f"test_codec_decode_random_bytes[{name}]")


@pytest.mark.parametrize("name", CODECS)
@FUZZ
@given(data=st.data())
def test_codec_decode_mutated_encodings(name: str, data: st.DataObject) -> None:
    count = data.draw(st.integers(0, 3000))
    seed = data.draw(st.integers(0, 2**32 - 1))
    values = np.random.default_rng(seed).standard_normal(count).astype(np.float32)
    encoded = encode_tensor(codec_of(name), values)
    test = f"test_codec_decode_mutated_encodings[{name}]"
    decode_checked(codec_of(name), mutated(encoded, data), count, test)
