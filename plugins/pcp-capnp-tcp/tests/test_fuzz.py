"""Fuzzing what a network peer reaches: `header.decode` and the frame reader behind `receive`.

Whatever bytes arrive, decoding must end in a message or a TransportError (never another
exception, never a hang), and reading a frame must not allocate much more than the frame
limit. Inputs are random bytes and valid frames of every message type, mutated. Messages
are built from the dataclasses' fields, so new message types are fuzzed without edits.

    PCP_FUZZ_EXAMPLES=20000 pytest plugins/pcp-capnp-tcp/tests/test_fuzz.py  # a long run
    PCP_FUZZ_REPORT=tried.json ...  # writes {test name: inputs tried} when the tests end
"""

import contextlib
import dataclasses
import math
import socket
import struct
import time
import tracemalloc
import typing
from collections.abc import Iterator
from typing import Any

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes
from pcp_capnp_tcp import header
from pcp_capnp_tcp.connection import MAGIC, PREFIX, CapnpConnection

from pcp_core.testing.fuzzing import FUZZ, TRIED, report_tried  # noqa: F401 (autouse)
from pcp_core.wire.messages import MESSAGE_TYPES, Message, Stop, Tensor
from pcp_core.wire.transport import TensorHeader, TransportError, TransportOptions

MAX_FRAME_BYTES = 2**20
TIMEOUT_S = 2.0
HANG_S = 10.0  # a receive of a few KiB taking this long is a hang, even on a loaded machine
ALLOCATION_SLACK = 256 * 2**10  # Python objects besides the frame's own bytes
U64 = 2**64 - 1


# --- valid messages, from the dataclasses and the schema --------------------------------

INT_BOUNDS = {f"int{bits}": (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) for bits in (8, 16, 32, 64)}
INT_BOUNDS |= {f"uint{bits}": (0, 2**bits - 1) for bits in (8, 16, 32, 64)}
FLOAT_WIDTHS = {"float32": 32, "float64": 64}


def _wire_type(cls: type, name: str) -> str:
    """The capnp type of a message field ("int32", "float64", ...), which bounds its values."""
    member = header.schema().Frame.schema.fields["message"].schema.fields[header._member(cls)]
    return member.schema.fields[header._camel(name)].proto.slot.type.which()


def _field_strategy(cls: type, name: str, annotation: object) -> st.SearchStrategy:
    """Any value the field can carry; TypeError for an annotation this file does not know."""
    if annotation == list[Tensor]:
        return st.lists(tensors(), max_size=4)
    if annotation is str:
        return st.text(max_size=40)
    if annotation is bytes:
        return st.binary(max_size=64)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        low, high = INT_BOUNDS[_wire_type(cls, name)]
        return st.integers(low, high)
    if annotation is float:
        return st.floats(width=FLOAT_WIDTHS[_wire_type(cls, name)])
    if annotation == list[float]:
        return st.lists(st.floats(width=64), max_size=16)
    raise TypeError(
        f"{cls.__name__}.{name}: no fuzz strategy for {annotation!r}; add one to {__file__}"
    )


def message_strategy(cls: type) -> st.SearchStrategy[Message]:
    """Any message of type `cls`, every field drawn from its annotation."""
    hints = typing.get_type_hints(cls)
    fields = {
        field.name: _field_strategy(cls, field.name, hints[field.name])
        for field in dataclasses.fields(cls)
    }
    return st.fixed_dictionaries(fields).map(lambda values: cls(**values))


def _wire_dtype_names() -> list[str]:
    """Every dtype name the wire accepts, from numpy's scalar types and ml_dtypes."""
    candidates = {np.dtype(kind).name for kind in set(np.sctypeDict.values())}
    with contextlib.suppress(ImportError):  # optional, as in header.wire_dtype
        import ml_dtypes

        candidates |= set(dir(ml_dtypes))
    accepted = []
    for name in sorted(candidates):
        try:
            header.wire_dtype(name)
        except ValueError:
            continue
        accepted.append(name)
    return accepted


DTYPES = _wire_dtype_names()


@st.composite
def tensors(draw: st.DrawFn) -> Tensor:
    """A tensor of any wire dtype and small shape, possibly big-endian or not contiguous."""
    dtype = header.wire_dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
    size = math.prod(shape) * dtype.itemsize
    array = np.frombuffer(draw(st.binary(min_size=size, max_size=size)), dtype).reshape(shape)
    if dtype.type.__module__ == "numpy" and dtype.itemsize > 1 and draw(st.booleans()):
        array = array.astype(dtype.newbyteorder(">"))
    return Tensor(draw(st.text(max_size=12)), array.T if draw(st.booleans()) else array)


MESSAGES = st.one_of([message_strategy(cls) for cls in MESSAGE_TYPES])


def wire_headers(message: Message) -> list[TensorHeader]:
    """The tensor headers `CapnpConnection.send` writes for `message`."""
    return [
        TensorHeader(tensor.name, tensor.array.dtype.name, tensor.array.shape, tensor.array.nbytes)
        for tensor in getattr(message, "tensors", [])
    ]


def payload_of(message: Message) -> bytes:
    """The frame payload `CapnpConnection.send` writes for `message`."""
    return b"".join(
        np.ascontiguousarray(tensor.array, tensor.array.dtype.newbyteorder("<")).tobytes()
        for tensor in getattr(message, "tensors", [])
    )


# --- random tensor headers and mutations ---------------------------------------------

ODD_DTYPES = ["", "f4", "<f4", ">i2", "object", "V8", "S4", "U2", "M8[s]", "(2,)i4", "a", "?"]


@st.composite
def tensor_headers(draw: st.DrawFn) -> TensorHeader:
    """A tensor header that may or may not agree with itself: odd dtypes, huge shapes."""
    dtype = draw(st.sampled_from(DTYPES) | st.sampled_from(ODD_DTYPES) | st.text(max_size=12))
    shape = tuple(draw(st.lists(st.integers(0, 8) | st.integers(0, U64), max_size=40)))
    try:
        consistent = math.prod(shape) * header.wire_dtype(dtype).itemsize
    except ValueError:
        consistent = 0
    nbytes = draw(st.integers(0, U64) | st.just(min(consistent, U64)))
    return TensorHeader(draw(st.text(max_size=12)), dtype, shape, nbytes)


def _words(buffer: bytearray) -> int:
    return len(buffer) // 8


def _field(bits: int) -> st.SearchStrategy[int]:
    """A value for a `bits`-wide length field, its boundaries (empty, one, full) often."""
    return st.sampled_from([0, 1, 2**bits - 1]) | st.integers(0, 2**bits - 1)


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` after a few bit flips, cuts, splices or rewritten capnp length fields."""
    buffer = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "splice", "word", "pointer", "table"]))
        if kind == "flip" and buffer:
            buffer[draw(st.integers(0, len(buffer) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del buffer[draw(st.integers(0, len(buffer))) :]
        elif kind == "splice":
            start = draw(st.integers(0, len(buffer)))
            end = draw(st.integers(start, len(buffer)))
            buffer[start:end] = draw(st.binary(max_size=32))
        elif kind == "word" and _words(buffer):
            at = 8 * draw(st.integers(0, _words(buffer) - 1))
            buffer[at : at + 8] = struct.pack("<Q", draw(st.integers(0, U64)))
        elif kind == "pointer" and _words(buffer):
            # a capnp pointer's sizes: list element size and count, or struct sizes (and,
            # in an inline-composite list's tag, the element count)
            at = 8 * draw(st.integers(0, _words(buffer) - 1))
            low, high = struct.unpack_from("<II", buffer, at)
            if low & 3 == 1:
                high = draw(st.integers(0, 7)) | draw(_field(29)) << 3
            else:
                low = draw(_field(30)) << 2 | low & 3
                high = draw(_field(16)) | draw(_field(16)) << 16
            struct.pack_into("<II", buffer, at, low, high)
        elif kind == "table" and len(buffer) >= 4:
            # the segment table: segment count, then each segment's size in words
            at = 4 * draw(st.integers(0, min(len(buffer) // 4, 4) - 1))
            struct.pack_into("<I", buffer, at, draw(st.integers(0, 2**32 - 1)))
    return bytes(buffer)


@st.composite
def encoded_headers(draw: st.DrawFn) -> tuple[bytes, int]:
    """A valid encoding of any message with random tensor headers, and a payload size."""
    message = draw(MESSAGES)
    headers = draw(st.lists(tensor_headers(), max_size=4))
    if not hasattr(message, "tensors") and draw(st.booleans()):
        headers = []
    total = sum(tensor.nbytes for tensor in headers)
    return header.encode(message, headers), draw(st.just(total) | st.integers(0, U64))


# --- what every decode keeps to -----------------------------------------------------


@contextlib.contextmanager
def bounded(max_bytes: int) -> Iterator[None]:
    """Fails the test if the block takes HANG_S or allocates `max_bytes` or more.

    tracemalloc sees numpy's array buffers as well as Python objects; it does not see
    capnp's own C++ allocations.
    """
    tracemalloc.start()
    try:
        started = time.monotonic()
        yield
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < max_bytes, f"allocated {peak} bytes"  # first: it does not vary by run
    assert elapsed < HANG_S, f"took {elapsed:.1f} s"


def zero_size_tensors(count: int) -> bytes:
    """A Stop's header whose tensor list claims `count` zero-size structs, in 64 bytes.

    Found by test_receive_mutated_frames: under capnp's default traversal limit, decoding
    100 000 of them took seconds and 11 MB, 8 million about a GiB.
    """
    encoded = bytearray(header.encode(Stop(), []))
    # the empty tensor list comes last: its tag, 0 structs of 1 data word and 3 pointers
    assert struct.unpack_from("<IHH", encoded, len(encoded) - 8) == (0, 1, 3)
    struct.pack_into("<IHH", encoded, len(encoded) - 8, count << 2, 0, 0)
    return bytes(encoded)


ZERO_SIZE_TENSORS = zero_size_tensors(100_000)


# --- header.decode ----------------------------------------------------------------------


def decode_or_refuse(data: bytes, payload_bytes: int) -> None:
    """`header.decode`, which may refuse with a TransportError and nothing else, and
    allocates little more than its input."""
    with bounded(len(data) + ALLOCATION_SLACK), contextlib.suppress(TransportError):
        header.decode(data, payload_bytes)


@FUZZ
@given(
    data=st.binary(max_size=512) | st.binary(max_size=512).map(lambda tail: bytes(4) + tail),
    payload_bytes=st.integers(0, U64),
)
@example(data=ZERO_SIZE_TENSORS, payload_bytes=0)
def test_header_decode_random_bytes(data: bytes, payload_bytes: int) -> None:
    TRIED["test_header_decode_random_bytes"] += 1
    decode_or_refuse(data, payload_bytes)


@FUZZ
@given(encoded=encoded_headers(), data=st.data())
def test_header_decode_mutated(encoded: tuple[bytes, int], data: st.DataObject) -> None:
    valid, payload_bytes = encoded
    tried = data.draw(mutated(valid) | st.just(valid))
    TRIED["test_header_decode_mutated"] += 1  # after the draws, which may give up
    decode_or_refuse(tried, payload_bytes)


# --- the frame reader -------------------------------------------------------------------


class ExpectingSink:
    """A TensorSink that, like the shepherd's, takes only the tensors it expects.

    Checks that each array it is handed back is the one it gave out, filled in order.
    """

    def __init__(self, expected: list[TensorHeader]) -> None:
        self.expected = expected
        self.arrays: list[np.ndarray] = []

    def buffer(self, index: int, tensor: TensorHeader) -> np.ndarray:
        if index >= len(self.expected) or tensor != self.expected[index]:
            raise TransportError(f"unexpected tensor {index}: {tensor}")
        self.arrays.append(np.empty(tensor.shape, header.wire_dtype(tensor.dtype)))
        return self.arrays[-1]

    def filled(self, index: int, tensor: TensorHeader, array: np.ndarray) -> None:
        assert index == len(self.arrays) - 1
        assert array is self.arrays[index]
        assert array.shape == tensor.shape == self.expected[index].shape


def receive_written(data: bytes | Message, sink: ExpectingSink | None) -> Message | TransportError:
    """What `receive` makes of `data` (raw bytes, or a message it sends) from a peer that
    then closes.

    Fails the test if anything but a TransportError escapes, if it takes HANG_S, or if
    it allocates more than the frame limit plus ALLOCATION_SLACK.
    """
    reader_socket, writer = socket.socketpair()
    reader_socket.settimeout(TIMEOUT_S)
    writer.settimeout(TIMEOUT_S)
    options = TransportOptions(max_frame_bytes=MAX_FRAME_BYTES, timeout_s=TIMEOUT_S)
    reader = CapnpConnection(reader_socket, "fuzzer", options)
    with writer:
        if isinstance(data, bytes):
            writer.sendall(data)
        else:
            CapnpConnection(writer, "fuzzer", options).send(data)
    result: Message | TransportError
    try:
        with bounded(MAX_FRAME_BYTES + ALLOCATION_SLACK):
            try:
                result = reader.receive(sink)
            except TransportError as error:
                result = error
    finally:
        reader.close()
    return result


def sinks(message: Message) -> st.SearchStrategy[ExpectingSink | None]:
    """No sink, or one expecting `message`'s tensors."""
    return st.none() | st.builds(ExpectingSink, st.just(wire_headers(message)))


@FUZZ
@given(
    data=st.binary(max_size=1024)
    | st.binary(max_size=1024).map(lambda tail: MAGIC + tail)
    | st.builds(
        lambda header_bytes, payload, tail: PREFIX.pack(MAGIC, header_bytes, payload) + tail,
        st.integers(0, 2**32 - 1),
        st.integers(0, U64),
        st.binary(max_size=1024),
    ),
    with_sink=st.booleans(),
)
@example(data=PREFIX.pack(MAGIC, len(ZERO_SIZE_TENSORS), 0) + ZERO_SIZE_TENSORS, with_sink=False)
def test_receive_random_bytes(data: bytes, with_sink: bool) -> None:
    TRIED["test_receive_random_bytes"] += 1
    receive_written(data, ExpectingSink([]) if with_sink else None)


@st.composite
def mutated_frames(draw: st.DrawFn, message: Message) -> bytes:
    """`message`'s frame with its header mutated (the prefix may or may not agree), or the
    whole frame mutated; its payload possibly cut short."""
    encoded, payload = header.encode(message, wire_headers(message)), payload_of(message)
    where = draw(st.sampled_from(["header", "prefix", "frame"]))
    if where == "header":
        encoded = draw(mutated(encoded))
    prefix = PREFIX.pack(MAGIC, len(encoded), len(payload))
    if where == "prefix":
        lengths = st.integers(0, 2**32 - 1), st.integers(0, U64)
        prefix = PREFIX.pack(MAGIC, draw(lengths[0]), draw(lengths[1]))
    frame = prefix + encoded + payload
    if where == "frame":
        frame = draw(mutated(frame))
    return frame[: draw(st.integers(0, len(frame)))] if draw(st.booleans()) else frame


@FUZZ
@given(message=MESSAGES, data=st.data())
def test_receive_mutated_frames(message: Message, data: st.DataObject) -> None:
    frame, sink = data.draw(mutated_frames(message)), data.draw(sinks(message))
    TRIED["test_receive_mutated_frames"] += 1
    receive_written(frame, sink)


def _same_value(got: Any, want: Any) -> bool:
    if isinstance(want, float):
        return isinstance(got, float) and (got == want or (math.isnan(got) and math.isnan(want)))
    if isinstance(want, list):
        return len(got) == len(want) and all(map(_same_value, got, want))
    return type(got) is type(want) and got == want


def assert_same(got: Message, want: Message, sink: ExpectingSink | None) -> None:
    """`got` is `want` field by field, its tensors (or the sink's arrays) byte for byte."""
    assert type(got) is type(want)
    for field in dataclasses.fields(want):
        if field.name != "tensors":
            assert _same_value(getattr(got, field.name), getattr(want, field.name)), field.name
    sent, received = getattr(want, "tensors", []), getattr(got, "tensors", [])
    if sink is None:
        assert [tensor.name for tensor in received] == [tensor.name for tensor in sent]
        arrays = [tensor.array for tensor in received]
    else:
        assert not received
        arrays = sink.arrays
    for array, tensor in zip(arrays, sent, strict=True):
        assert array.dtype == header.wire_dtype(tensor.array.dtype.name)
        assert array.shape == tensor.array.shape
        wire = np.ascontiguousarray(tensor.array, tensor.array.dtype.newbyteorder("<"))
        assert array.tobytes() == wire.tobytes()


@FUZZ
@given(message=MESSAGES, data=st.data())
def test_receive_round_trip(message: Message, data: st.DataObject) -> None:
    sink = data.draw(sinks(message))
    TRIED["test_receive_round_trip"] += 1
    received = receive_written(message, sink)
    assert not isinstance(received, TransportError), received
    assert_same(received, message, sink)
