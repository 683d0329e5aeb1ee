"""Codecs: how a float32 tensor crosses the link as bytes, and back.

A codec plugin registers `Codec` objects (`pcp_register_codecs`). A codec sees one
tensor at a time, flattened: `encode` turns float32 values into bytes, `decode` turns
bytes from the network back into exactly `count` float32 values, and `max_bytes` says
how many bytes an encoding of `count` values may take, so a receiver refuses a longer
one before reading it. Everything else is here, once for every codec:

- **Framing** (`encode_tensor`, `decode_tensor`): one leading byte says whether the
  body is the codec's or a marker for a tensor that held NaN or Inf, then the tensor's
  shape (a byte for the number of dimensions, four for each), which the receiver holds
  to the one it expects, as it does a float32 tensor's: a transposed matrix of the right
  size is refused, not decoded into the other shape. A non-finite tensor decodes to NaNs
  whatever the codec, so the shepherd's result checks refuse it as they refuse a float32
  one; a codec only ever encodes finite values.
- **Error feedback** (`Feedback`): a lossy codec may ask for it (`feedback = True`, as
  top-k selection does): the sender keeps, per tensor, what the decoded form lacked and
  adds it to that tensor's next value before encoding, so nothing is lost for good,
  only sent later. A run may decay what is owed each time (`RunSettings.feedback_decay`,
  SparseLoCo's accumulator), so old errors fade instead of piling up.
- **Options** (`Codec.tuned`): a codec with parameters (how much a sparse codec keeps,
  say) takes them by name from the run (`RunSettings.codec_options`); both ends tune it
  the same way, so no option travels in the bytes.

Decoders read bytes from the network: a malformed body raises `CodecError` with a
message that says what is wrong, never another exception, and allocates no more than
the `count` values it was asked for.
"""

import struct
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

FINITE, NON_FINITE = 0, 1  # the framing byte
MAX_DIMENSIONS = 32


class CodecError(ValueError):
    """Bytes that are no encoding of the tensor they claim to be."""


class Codec(ABC):
    """Float32 values to bytes and back; see the module docstring."""

    name: str
    description: str
    feedback: bool = False  # the sender keeps what the decoded form lacks (`Feedback`)

    @abstractmethod
    def encode(self, values: np.ndarray) -> bytes:
        """Finite float32 values, one dimension, to bytes."""

    @abstractmethod
    def decode(self, data: bytes, count: int) -> np.ndarray:
        """`count` float32 values from `data`; CodecError if `data` is not an encoding."""

    @abstractmethod
    def max_bytes(self, count: int) -> int:
        """The longest encoding of `count` values."""

    @abstractmethod
    def error_bound(self, values: np.ndarray) -> np.ndarray:
        """The largest absolute error of each decoded value of `values` (without error
        feedback); the conformance suite holds every round trip to it."""

    def tuned(self, options: Mapping[str, float]) -> "Codec":
        """This codec with the run's `options`; CodecError, one line, for an option it
        does not take or a value out of its range. Without options, itself."""
        if options:
            raise CodecError(f"{self.name} takes no options (given {', '.join(sorted(options))})")
        return self


def frame_bytes(shape: tuple[int, ...]) -> int:
    """The bytes framing adds to a tensor of `shape`: the marker and the shape."""
    return 2 + 4 * len(shape)


def max_encoded_bytes(codec: Codec, shape: tuple[int, ...]) -> int:
    """The longest framed encoding of a tensor of `shape`."""
    return frame_bytes(shape) + codec.max_bytes(int(np.prod(shape, dtype=np.int64)))


def _frame(marker: int, shape: tuple[int, ...]) -> bytes:
    return bytes([marker, len(shape)]) + struct.pack(f"<{len(shape)}I", *shape)


def encode_tensor(codec: Codec, array: np.ndarray) -> bytes:
    """An array (any shape, float32) framed for the link."""
    values = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
    if not np.isfinite(values).all():
        return _frame(NON_FINITE, array.shape)
    return _frame(FINITE, array.shape) + codec.encode(values)


def decode_tensor(codec: Codec, data: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 array of `shape` that `data` frames; CodecError if it frames none, or
    a tensor of another shape."""
    shape = tuple(int(n) for n in shape)
    count = int(np.prod(shape, dtype=np.int64))
    head = frame_bytes(shape)
    if len(data) < 2:
        raise CodecError(f"{codec.name}: {len(data)} bytes, no framing of a tensor")
    if data[0] not in (FINITE, NON_FINITE):
        raise CodecError(f"{codec.name}: unknown framing byte {data[0]}")
    if data[1] != len(shape) or len(data) < head:
        raise CodecError(
            f"{codec.name}: frames a tensor of {data[1]} dimensions, expected shape {shape}"
        )
    framed = struct.unpack_from(f"<{len(shape)}I", data, 2)
    if framed != shape:
        raise CodecError(f"{codec.name}: frames a tensor of shape {framed}, expected {shape}")
    if len(data) > head + codec.max_bytes(count):
        raise CodecError(
            f"{codec.name}: {len(data) - head} bytes, more than the {codec.max_bytes(count)} "
            f"an encoding of {count} values may take"
        )
    if data[0] == NON_FINITE:
        if len(data) != head:
            raise CodecError(f"{codec.name}: a non-finite marker with a body")
        return np.full(shape, np.nan, np.float32)
    values = codec.decode(memoryview(data)[head:].tobytes(), count)
    if values.dtype != np.float32 or values.shape != (count,):
        raise CodecError(f"{codec.name}: decoded {values.dtype} {values.shape}, not {count}")
    return values.reshape(shape)


@dataclass
class Feedback:
    """Error feedback for one sender: per tensor name, what the decoded forms lacked."""

    codec: Codec
    residuals: dict[str, np.ndarray] = field(default_factory=dict)
    decay: float = 1.0  # what is owed is multiplied by this before each next encoding

    def encode(self, name: str, array: np.ndarray) -> tuple[bytes, np.ndarray]:
        """Encode `array` plus what this tensor's last encodings left out (decayed), and
        keep what this one leaves out (nothing after a non-finite tensor); the bytes and
        their decoded form, what the receiver will see."""
        owed = self.residuals.pop(name, None) if self.codec.feedback else None
        if owed is None:
            target = array.astype(np.float32)
        else:
            target = array + (owed if self.decay == 1.0 else np.float32(self.decay) * owed)
        data = encode_tensor(self.codec, target)
        decoded = decode_tensor(self.codec, data, target.shape)
        if self.codec.feedback and data[0] == FINITE:
            self.residuals[name] = target - decoded
        return data, decoded


class Float32(Codec):
    """The values as they are, little-endian: today's wire format."""

    name = "f32"
    description = "float32 as it is (4 bytes a value, lossless)"

    def encode(self, values: np.ndarray) -> bytes:
        return values.astype("<f4", copy=False).tobytes()

    def decode(self, data: bytes, count: int) -> np.ndarray:
        if len(data) != 4 * count:
            raise CodecError(f"f32: {len(data)} bytes for {count} values, expected {4 * count}")
        return np.frombuffer(data, "<f4").astype(np.float32)

    def max_bytes(self, count: int) -> int:
        return 4 * count

    def error_bound(self, values: np.ndarray) -> np.ndarray:
        return np.zeros_like(values)


FLOAT32 = Float32()


class CodecLookup(Protocol):
    """Where codecs are found by name: the run's plugin host."""

    def codec(self, name: str) -> Codec: ...


def on_the_wire(
    name: str, codecs: CodecLookup, options: Mapping[str, float] | None = None
) -> Codec | None:
    """The registered codec `name`, tuned with `options`, that tensors are encoded with,
    or None for f32: float32 tensors then cross as they are, unframed (today's format)."""
    codec = FLOAT32 if name == FLOAT32.name else codecs.codec(name)
    tuned = codec.tuned(options or {})
    return None if tuned is FLOAT32 else tuned
