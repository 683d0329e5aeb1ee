"""The shepherd's side of a codec: a Delta's encoded tensors are checked against the
codec's limits as their headers arrive and decoded into the staging buffer; anything
else is a malformed delta (the connection is closed, the result refused)."""

import numpy as np
import pytest

from pcp_core import parallel, plugins
from pcp_core.codecs import encode_tensor, frame_bytes, max_encoded_bytes
from pcp_core.program.build import TensorSpec
from pcp_core.shepherd.aggregation import DeltaSink, MalformedDelta
from pcp_core.wire.transport import TensorHeader

SPEC = TensorSpec("w", (40, 30), "float32")


def receive(sink: DeltaSink, name: str, array: np.ndarray) -> None:
    """What the transport does with one tensor: header, buffer, bytes, filled."""
    header = TensorHeader(name, array.dtype.name, array.shape, array.nbytes)
    buffer = sink.buffer(0, header)
    buffer[...] = array
    sink.filled(0, header, buffer)


@pytest.mark.parametrize("name", ["bf16", "int8", "fp4", "topk"])
def test_an_encoded_tensor_is_decoded_into_the_staging_buffer(name: str) -> None:
    codec = plugins.host().codec(name)
    values = np.random.default_rng(0).standard_normal(SPEC.shape).astype(np.float32)
    data = np.frombuffer(encode_tensor(codec, values), np.uint8)
    staging = np.zeros(SPEC.shape, np.float32)
    sink = DeltaSink([staging], [SPEC], codec)
    receive(sink, "w", data)
    assert sink.filled_count == 1 and sink.received_bytes == data.size
    assert (
        np.abs(staging - values) <= codec.error_bound(values.reshape(-1)).reshape(SPEC.shape)
    ).all()


def test_float32_where_a_codec_was_agreed_is_malformed() -> None:
    sink = DeltaSink([np.zeros(SPEC.shape, np.float32)], [SPEC], plugins.host().codec("int8"))
    with pytest.raises(MalformedDelta, match="not a int8 encoding"):
        receive(sink, "w", np.zeros(SPEC.shape, np.float32))


def test_more_bytes_than_the_codec_may_take_are_refused_before_reading() -> None:
    codec = plugins.host().codec("int8")
    sink = DeltaSink([np.zeros(SPEC.shape, np.float32)], [SPEC], codec)
    too_long = 1 + max_encoded_bytes(codec, SPEC.shape)
    header = TensorHeader("w", "uint8", (too_long,), too_long)
    with pytest.raises(MalformedDelta, match="at most"):
        sink.buffer(0, header)


def test_bytes_that_decode_to_nothing_are_malformed() -> None:
    codec = plugins.host().codec("fp4")
    sink = DeltaSink([np.zeros(SPEC.shape, np.float32)], [SPEC], codec)
    garbage = np.full(max_encoded_bytes(codec, SPEC.shape), 0xFF, np.uint8)
    head = frame_bytes(SPEC.shape)
    garbage[:head] = np.frombuffer(encode_tensor(codec, np.zeros(SPEC.shape))[:head], np.uint8)
    with pytest.raises(MalformedDelta, match="scale"):
        receive(sink, "w", garbage)


def test_a_transposed_tensor_is_malformed() -> None:
    """The right number of values in another shape: refused as float32 refuses it."""
    codec = plugins.host().codec("fp4")
    sink = DeltaSink([np.zeros(SPEC.shape, np.float32)], [SPEC], codec)
    transposed = np.ones(SPEC.shape[::-1], np.float32)
    with pytest.raises(MalformedDelta, match="shape"):
        receive(sink, "w", np.frombuffer(encode_tensor(codec, transposed), np.uint8))


def test_a_tensor_of_another_name_is_malformed() -> None:
    sink = DeltaSink([np.zeros(SPEC.shape, np.float32)], [SPEC], plugins.host().codec("bf16"))
    with pytest.raises(MalformedDelta, match="expected w"):
        receive(sink, "v", np.zeros(10, np.uint8))


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "PIECE", 100)  # a 12-tensor delta decodes on the pool


def many(sink: DeltaSink, encodings: list[np.ndarray]) -> None:
    for index, data in enumerate(encodings):
        header = TensorHeader(f"w{index}", "uint8", data.shape, data.nbytes)
        sink.buffer(index, header)[...] = data
        sink.filled(index, header, data)


@pytest.mark.usefixtures("small_pieces")
def test_a_deltas_tensors_decode_side_by_side_into_their_buffers() -> None:
    codec = plugins.host().codec("fp4")
    specs = [TensorSpec(f"w{i}", SPEC.shape, "float32") for i in range(12)]
    rng = np.random.default_rng(1)
    values = [rng.standard_normal(SPEC.shape).astype(np.float32) for _ in specs]
    staging = [np.zeros(SPEC.shape, np.float32) for _ in specs]
    sink = DeltaSink(staging, specs, codec)
    many(sink, [np.frombuffer(encode_tensor(codec, v), np.uint8) for v in values])
    for got, sent in zip(staging, values, strict=True):  # all there once the last is read
        assert (np.abs(got - sent) <= codec.error_bound(sent.reshape(-1)).reshape(SPEC.shape)).all()


@pytest.mark.usefixtures("small_pieces")
def test_a_bad_tensor_among_many_is_malformed_and_leaves_nothing_decoding() -> None:
    codec = plugins.host().codec("fp4")
    specs = [TensorSpec(f"w{i}", SPEC.shape, "float32") for i in range(12)]
    good = np.frombuffer(encode_tensor(codec, np.ones(SPEC.shape, np.float32)), np.uint8)
    transposed = np.frombuffer(encode_tensor(codec, np.ones((30, 40), np.float32)), np.uint8)
    sink = DeltaSink([np.zeros(SPEC.shape, np.float32) for _ in specs], specs, codec)
    with pytest.raises(MalformedDelta, match=r"w5: .*shape"):
        many(sink, [good] * 5 + [transposed] + [good] * 6)  # raised by the last at the latest
    assert all(decoding.done() for decoding in sink._decoding)  # none writes on after it
