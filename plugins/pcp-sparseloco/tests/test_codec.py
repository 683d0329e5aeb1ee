"""The sparse2 codec: the codec conformance suite at its defaults and at a density that
stores positions as a bitmap, its options, what it saves, and its decoder fuzzed.

    PCP_FUZZ_EXAMPLES=30000 pytest plugins/pcp-sparseloco/tests/test_codec.py -k fuzz
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pcp_sparseloco.codec import SPARSE2, SparseTwoBit

from pcp_core import plugins
from pcp_core.codecs import CodecError, Feedback, encode_tensor, on_the_wire
from pcp_core.testing.codec_suite import CodecConformance
from pcp_core.testing.fuzzing import (  # noqa: F401 (report_tried: autouse)
    FUZZ,
    decode_checked,
    mutated,
    report_tried,
)

DENSE = {"density": 0.25, "chunk": 256}  # gaps of 1 bit and a short unary part


class TestSparse2(CodecConformance):
    codec_name = "sparse2"


class TestSparse2Dense(CodecConformance):
    codec_name = "sparse2"

    @pytest.fixture
    def codec(self) -> SparseTwoBit:
        return plugins.host().codec("sparse2").tuned(DENSE)


def test_the_default_sends_67_times_fewer_bytes_than_float32() -> None:
    values = np.random.default_rng(0).standard_normal(64 * 4096).astype(np.float32)
    data = SPARSE2.encode(values)
    assert values.nbytes / len(data) > 67
    assert values.nbytes / len(SPARSE2.tuned({"density": 1 / 64}).encode(values)) > 200
    decoded = SPARSE2.decode(data, values.size)
    assert np.count_nonzero(decoded) == 64 * 256  # 1/16 of each chunk
    kept = decoded != 0
    assert (np.sign(decoded[kept]) == np.sign(values[kept])).all()
    # the kept values are the largest of their chunk
    for chunk in range(64):
        part = slice(chunk * 4096, (chunk + 1) * 4096)
        smallest_kept = np.abs(values[part][kept[part]]).min()
        assert smallest_kept >= np.abs(values[part][~kept[part]]).max()


def test_positions_take_near_their_entropy() -> None:
    """Rice-coded gaps: 7.5 bits a position at 1/64 (a geometric gap's entropy, log2(e
    times the mean gap), is 7.4 there), 5.4 at 1/16 (5.3); 12 as plain numbers."""
    values = np.random.default_rng(2).standard_normal(64 * 4096).astype(np.float32)
    for options, bits in (({"density": 1 / 64}, 7.5), ({}, 5.4)):
        codec = SPARSE2.tuned(options)
        kept = codec.layout(values.size).kept
        position_bits = 8 * (len(codec.encode(values)) - 64 * 4) - 2 * kept
        assert bits - 0.1 < position_bits / kept < bits + 0.1, position_bits / kept


def test_options_are_checked_in_one_line() -> None:
    for options, message in [
        ({"density": 0.0}, "density 0.0 is not a number in"),
        ({"density": 0.7}, "density 0.7 is not a number in"),
        ({"chunk": 32}, "chunk 32 is not"),
        ({"chunk": 100.5}, "chunk 100.5 is not"),
        ({"stride": 2}, "takes density and chunk, not stride"),
        ({"chunk": float("nan")}, "chunk nan is not"),
        ({"chunk": float("inf")}, "chunk inf is not"),
        ({"chunk": None}, "chunk None is not"),
        ({"density": "a lot"}, "density 'a lot' is not"),
    ]:
        with pytest.raises(CodecError, match=message):
            SPARSE2.tuned(options)
    with pytest.raises(CodecError, match="fp4 takes no options"):
        on_the_wire("fp4", plugins.host(), {"density": 0.1})
    with pytest.raises(CodecError, match="f32 takes no options"):
        on_the_wire("f32", plugins.host(), {"density": 0.1})
    assert on_the_wire("f32", plugins.host()) is None


def test_decayed_feedback_is_sparseloco_accumulator() -> None:
    """Error feedback with decay β: each round the accumulator is β times what it owed
    plus the new values; what is sent leaves it."""
    rng = np.random.default_rng(1)
    feedback, accumulator = Feedback(SPARSE2, decay=0.9), np.zeros(5000, np.float32)
    for _ in range(5):
        values = rng.standard_normal(5000).astype(np.float32)
        accumulator = np.float32(0.9) * accumulator + values
        _, sent = feedback.encode("w", values)
        accumulator -= sent
        np.testing.assert_allclose(feedback.residuals["w"], accumulator, rtol=1e-5, atol=1e-6)


CODECS = {
    "default": SPARSE2,
    "sparse": SPARSE2.tuned({"density": 1 / 64}),
    "dense": SPARSE2.tuned(DENSE),
    "small": SPARSE2.tuned({"chunk": 64}),
}


@pytest.mark.parametrize("name", CODECS)
@FUZZ
@given(data=st.data())
def test_fuzz_random_bytes(name: str, data: st.DataObject) -> None:
    count = data.draw(st.integers(0, 9000))
    body = data.draw(st.binary(max_size=CODECS[name].max_bytes(count) + 9))
    frame = bytes([0, 1]) + count.to_bytes(4, "little")
    decode_checked(CODECS[name], frame + body, count, f"random_bytes[{name}]")


@pytest.mark.parametrize("name", CODECS)
@FUZZ
@given(data=st.data())
def test_fuzz_mutated_encodings(name: str, data: st.DataObject) -> None:
    codec = CODECS[name]
    count = data.draw(st.integers(0, 9000))
    seed = data.draw(st.integers(0, 2**32 - 1))
    values = np.random.default_rng(seed).standard_normal(count).astype(np.float32)
    encoded = encode_tensor(codec, values)
    decode_checked(codec, mutated(encoded, data), count, f"mutated_encodings[{name}]")
