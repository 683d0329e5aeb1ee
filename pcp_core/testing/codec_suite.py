"""Conformance suite for codecs. A codec package proves itself in two lines:

    class TestMyCodec(CodecConformance):
        codec_name = "mine"

It is registered; every round trip keeps shapes, dtype float32 and each value within the
codec's declared `error_bound`; encodings are deterministic and no longer than
`max_bytes`; empty, single, odd-sized and large tensors and extreme magnitudes work; a
tensor with NaN or Inf decodes non-finite; malformed bytes (truncated, extended, random)
raise `CodecError` and nothing else; with error feedback, what was sent plus what is
still owed equals what was given.
"""

from typing import Any, ClassVar

import numpy as np
import pytest

from pcp_core.codecs import (
    CodecError,
    Feedback,
    decode_tensor,
    encode_tensor,
    max_encoded_bytes,
)

SHAPES = [(0,), (1,), (7,), (3, 5), (255,), (257,), (64, 130)]


def samples(seed: int = 0) -> list[np.ndarray]:
    """Tensors a codec must carry: normal, spiky, tiny, huge, constant, zero."""
    rng = np.random.default_rng(seed)
    spiky = rng.standard_normal(1000).astype(np.float32)
    spiky[17] = 1e4
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES] + [
        spiky,
        (rng.standard_normal(300) * 1e-30).astype(np.float32),
        (rng.standard_normal(300) * 1e30).astype(np.float32),
        np.full(100, -2.5, np.float32),
        np.zeros(50, np.float32),
        np.array([3e38, -3.4e38, 1e-45, -1e-40], np.float32),
    ]


class CodecConformance:
    codec_name: ClassVar[str]
    large_count: ClassVar[int] = 2**22 + 3  # a large tensor, not a multiple of any block

    @pytest.fixture
    def codec(self) -> Any:
        from pcp_core import plugins

        return plugins.host().codec(self.codec_name)

    def test_registered(self, codec: Any) -> None:
        assert codec.name == self.codec_name and codec.description

    @pytest.mark.parametrize("index", range(len(samples())))
    def test_round_trip_within_the_declared_bound(self, codec: Any, index: int) -> None:
        array = samples()[index]
        data = encode_tensor(codec, array)
        assert len(data) <= max_encoded_bytes(codec, array.shape)
        decoded = decode_tensor(codec, data, array.shape)
        assert decoded.shape == array.shape and decoded.dtype == np.float32
        error = np.abs(decoded.astype(np.float64) - array.astype(np.float64)).reshape(-1)
        bound = codec.error_bound(array.reshape(-1))
        worst = int(np.argmax(error - bound)) if error.size else 0
        assert (error <= bound).all(), (
            f"value {array.reshape(-1)[worst]!r} came back {decoded.reshape(-1)[worst]!r}"
        )

    def test_a_large_tensor(self, codec: Any) -> None:
        array = np.random.default_rng(1).standard_normal(self.large_count).astype(np.float32)
        decoded = decode_tensor(codec, encode_tensor(codec, array), array.shape)
        assert (np.abs(decoded - array) <= codec.error_bound(array)).all()

    def test_encoding_is_deterministic(self, codec: Any) -> None:
        for array in samples(2):
            assert encode_tensor(codec, array) == encode_tensor(codec, array.copy())

    @pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
    def test_non_finite_values_decode_non_finite(self, codec: Any, bad: float) -> None:
        array = np.arange(300, dtype=np.float32)
        array[123] = bad
        decoded = decode_tensor(codec, encode_tensor(codec, array), array.shape)
        assert not np.isfinite(decoded).all()

    def test_truncated_and_extended_bytes_are_refused(self, codec: Any) -> None:
        array = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
        data = encode_tensor(codec, array)
        for broken in (b"", data[:1], data[:-1], data + b"\0" * (codec.max_bytes(1000) + 1)):
            with pytest.raises(CodecError):
                decode_tensor(codec, broken, array.shape)
        with pytest.raises(CodecError):
            decode_tensor(codec, bytes([7]) + data[1:], array.shape)

    def test_a_tensor_of_another_shape_is_refused(self, codec: Any) -> None:
        """A transposed matrix has the right number of values, not the right shape."""
        array = np.random.default_rng(5).standard_normal((20, 50)).astype(np.float32)
        with pytest.raises(CodecError, match="shape"):
            decode_tensor(codec, encode_tensor(codec, array.T.copy()), array.shape)
        with pytest.raises(CodecError, match="dimensions"):
            decode_tensor(codec, encode_tensor(codec, array.reshape(-1)), array.shape)

    def test_random_bytes_raise_codec_error_or_decode(self, codec: Any) -> None:
        rng = np.random.default_rng(4)
        for _ in range(500):
            count = int(rng.integers(0, 600))
            size = int(rng.integers(0, codec.max_bytes(count) + 3))
            frame = bytes([int(rng.integers(0, 2)), 1]) + count.to_bytes(4, "little")
            data = frame + rng.bytes(size)
            try:
                decoded = decode_tensor(codec, data, (count,))
            except CodecError:
                continue
            assert decoded.shape == (count,) and decoded.dtype == np.float32

    def test_error_feedback_owes_exactly_what_was_not_sent(self, codec: Any) -> None:
        rng = np.random.default_rng(5)
        feedback, sent, given = Feedback(codec), np.zeros(500), np.zeros(500)
        for _ in range(20):
            array = rng.standard_normal(500).astype(np.float32)
            given += array
            data, decoded = feedback.encode("w", array)
            np.testing.assert_array_equal(decoded, decode_tensor(codec, data, array.shape))
            sent += decoded
        owed = feedback.residuals.get("w", np.zeros(500))
        if not codec.feedback:
            assert not feedback.residuals
            return
        np.testing.assert_allclose(sent + owed, given, rtol=1e-4, atol=1e-4)
