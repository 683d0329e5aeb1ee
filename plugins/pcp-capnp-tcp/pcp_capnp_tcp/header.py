"""The Cap'n Proto frame header: a message's metadata and its tensors' headers.

The only module that imports `capnp`, and only once a frame is encoded or decoded.
Messages map onto the schema by name: class `Hello` is union member `hello`, field
`worker_name` is `workerName`, so a message type or field missing from the schema
fails loudly when it is first encoded.
"""

import dataclasses
import math
import warnings
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from pcp_core.wire.messages import MESSAGE_TYPES, PROTOCOL_VERSION, Message
from pcp_core.wire.transport import ProtocolMismatch, TensorHeader, TransportError

SCHEMA_PATH = Path(__file__).with_name("pcp.capnp")
MAX_NDIM = 32
# Words capnp may read per word of header. Its default limit (64 MiB whatever the size)
# let 64 bytes claim millions of tensors (zero-size structs, which it counts as a word
# each) or repeat one text through aliased pointers; a well-formed header reads each
# word once, so twice its size keeps decoding proportional to the bytes received.
TRAVERSAL_PER_WORD = 2


@cache
def schema() -> Any:
    """The compiled `pcp.capnp` module."""
    import capnp

    return capnp.load(str(SCHEMA_PATH))


@cache  # a name that raises is not cached, so unknown names cannot fill it
def wire_dtype(name: str) -> np.dtype:
    """The little-endian dtype a wire name stands for: a numpy number or an ml_dtypes type.

    Only canonical names (`dtype.name`) are accepted, so each dtype has one spelling.
    """
    try:
        with warnings.catch_warnings():  # a deprecated alias ("a") is refused like the rest
            warnings.simplefilter("error", DeprecationWarning)
            dtype = np.dtype(name)
    except (TypeError, SyntaxError, DeprecationWarning):  # some strings read as field lists
        dtype = _ml_dtype(name)
    if dtype.name != name or not (dtype.kind in "biufc" or dtype.type.__module__ == "ml_dtypes"):
        raise ValueError(f"unsupported tensor dtype {name!r}: tensors must be numeric")
    return dtype.newbyteorder("<")


def _ml_dtype(name: str) -> np.dtype:
    try:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    except (ImportError, AttributeError, TypeError) as error:
        raise ValueError(f"unknown tensor dtype {name!r}") from error


def encode(message: Message, tensors: list[TensorHeader]) -> bytes:
    """The serialized header of a frame carrying `message` and tensors described by `tensors`."""
    frame = schema().Frame.new_message(version=PROTOCOL_VERSION)
    body = frame.message.init(_member(type(message)))
    for name in _metadata_fields(type(message)):
        setattr(body, _camel(name), getattr(message, name))
    for entry, tensor in zip(frame.init("tensors", len(tensors)), tensors, strict=True):
        entry.name = tensor.name
        entry.dtype = tensor.dtype
        entry.shape = list(tensor.shape)
        entry.nbytes = tensor.nbytes
    return frame.to_bytes()


def decode(data: bytes | bytearray, payload_bytes: int) -> tuple[Message, list[TensorHeader]]:
    """The message (its tensors still empty) and its tensor headers, checked for consistency.

    ProtocolMismatch for another protocol version, TransportError for anything malformed,
    including tensor headers that disagree with their dtype and shape or with the payload.
    """
    import capnp

    try:
        limit = TRAVERSAL_PER_WORD * (len(data) // 8)
        with schema().Frame.from_bytes(data, traversal_limit_in_words=limit) as frame:
            if frame.version != PROTOCOL_VERSION:
                raise ProtocolMismatch(
                    f"peer speaks PCP protocol version {frame.version}, "
                    f"this side speaks {PROTOCOL_VERSION}"
                )
            message = _read_message(frame.message)
            tensors = [
                TensorHeader(entry.name, entry.dtype, tuple(entry.shape), entry.nbytes)
                for entry in frame.tensors
            ]
        _check_tensors(message, tensors, payload_bytes)
    except (capnp.KjException, UnicodeDecodeError, ValueError) as error:
        raise TransportError(f"malformed frame header: {str(error).splitlines()[0]}") from error
    return message, tensors


def _read_message(union: Any) -> Message:
    member = union.which()
    cls = _TYPE_OF_MEMBER[member]
    body = getattr(union, member)
    values = {name: _plain(getattr(body, _camel(name))) for name in _metadata_fields(cls)}
    return cls(**values)


def _plain(value: Any) -> Any:
    """A Python value for a capnp field: scalars, str and bytes as they are; lists as lists."""
    return value if isinstance(value, str | bytes | int | float) else list(value)


def _check_tensors(message: Message, tensors: list[TensorHeader], payload_bytes: int) -> None:
    if tensors and not hasattr(message, "tensors"):
        raise ValueError(f"a {type(message).__name__} carries no tensors, got {len(tensors)}")
    for tensor in tensors:
        itemsize = wire_dtype(tensor.dtype).itemsize
        # numpy's own limits, which apply even to an empty array
        span = math.prod(dim for dim in tensor.shape if dim) * itemsize
        if len(tensor.shape) > MAX_NDIM or span > np.iinfo(np.intp).max:
            raise ValueError(f"tensor {tensor.name!r} has an impossible shape {tensor.shape}")
        expected = math.prod(tensor.shape) * itemsize
        if tensor.nbytes != expected:
            raise ValueError(
                f"tensor {tensor.name!r} ({tensor.dtype} {tensor.shape}) is {expected} bytes, "
                f"its header says {tensor.nbytes}"
            )
    total = sum(tensor.nbytes for tensor in tensors)
    if total != payload_bytes:
        raise ValueError(f"tensors add up to {total} bytes, the frame prefix says {payload_bytes}")


def _member(cls: type) -> str:
    return cls.__name__[0].lower() + cls.__name__[1:]


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.capitalize() for part in rest)


def _metadata_fields(cls: type) -> list[str]:
    return [field.name for field in dataclasses.fields(cls) if field.name != "tensors"]


_TYPE_OF_MEMBER: dict[str, type] = {_member(cls): cls for cls in MESSAGE_TYPES}
