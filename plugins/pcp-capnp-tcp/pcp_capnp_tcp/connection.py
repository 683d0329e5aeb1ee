"""One connection: messages framed as prefix, Cap'n Proto header, raw tensor bytes.

A frame is `PREFIX` (magic, header length, payload length), the header from
`pcp_capnp_tcp.header`, then each tensor's little-endian bytes back to back. Tensors
are written from and read into the arrays' own memory, in chunks, so a frame may be
many GiB and no tensor is ever copied into a message buffer. Every size is checked
against the prefix and the options before the payload is read; any failure while
receiving closes the connection, since the stream is then no longer at a frame boundary.
"""

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from functools import cache
from typing import Protocol, cast

import numpy as np
import structlog

from pcp_capnp_tcp import header
from pcp_core.wire.messages import Message, Tensor, tensors_of
from pcp_core.wire.transport import (
    FrameTooLarge,
    ProtocolMismatch,
    TensorHeader,
    TensorSink,
    TransportError,
    TransportOptions,
)

log = structlog.get_logger(__name__)

PREFIX = struct.Struct("<4sIQ")  # magic, header bytes, payload bytes
MAGIC = b"PCPc"
MAX_HEADER_BYTES = 64 * 2**20  # what capnp's default reader accepts
CHUNK_BYTES = 16 * 2**20  # per socket call: bounds each call's timeout and size


class _WithTensors(Protocol):
    """A message that carries tensors (Setup, Delta, ...): `header.decode` refuses tensor
    headers for any other."""

    tensors: list[Tensor]


class CapnpConnection:
    """A `pcp_core.wire.transport.Connection` over a connected (possibly TLS) socket.

    `send` and `receive` may run at the same time in two threads; each is serialized
    with itself. A `handshake` (a listener's TLS handshake) runs on first use, in the
    thread that first sends or receives, so a slow client never holds up `accept`.
    """

    def __init__(
        self,
        sock: socket.socket,
        peer: str,
        options: TransportOptions,
        handshake: Callable[[socket.socket], socket.socket] | None = None,
    ) -> None:
        self.peer = peer
        self.bytes_sent = 0
        self.bytes_received = 0
        self._sock = sock
        self._options = options
        self._send_lock = threading.Lock()
        self._receive_lock = threading.Lock()
        self._handshake = handshake
        self._handshake_lock = threading.Lock()

    def _ready(self) -> None:
        """Run the pending handshake, once; TransportError (connection closed) if it fails."""
        with self._handshake_lock:
            if self._handshake is not None:
                handshake, self._handshake = self._handshake, None
                self._sock = handshake(self._sock)
                self._sock.settimeout(self._options.timeout_s)

    def send(self, message: Message) -> int:
        """Send one message; returns the frame's size in bytes.

        Raises FrameTooLarge (nothing sent, connection still usable) if the frame is over
        the size limit, TransportError (connection closed) if the socket fails.
        """
        tensors = tensors_of(message)
        arrays = [_wire_array(tensor.array) for tensor in tensors]
        headers = [
            TensorHeader(tensor.name, _wire_name(array.dtype), array.shape, array.nbytes)
            for tensor, array in zip(tensors, arrays, strict=True)
        ]
        encoded = header.encode(message, headers)
        payload = sum(array.nbytes for array in arrays)
        _check_size(len(encoded), payload, self._options.max_frame_bytes)
        with self._send_lock:
            self._ready()
            try:
                self._write(PREFIX.pack(MAGIC, len(encoded), payload) + encoded)
                for array in arrays:
                    self._write(_bytes_of(array))
            except OSError as error:
                self.close()
                raise TransportError(f"sending to {self.peer} failed: {error}") from error
        return PREFIX.size + len(encoded) + payload

    def receive(
        self, sink: TensorSink | None = None, max_frame_bytes: int | None = None
    ) -> Message:
        """The next message.

        Without a sink its tensors hold fresh arrays; with one, each tensor is read into
        `sink.buffer(...)` and handed to `sink.filled(...)`, and the message's tensors
        stay empty. `max_frame_bytes` lowers the options' limit for this frame. Raises
        FrameTooLarge, ProtocolMismatch or TransportError, and closes the connection, for
        a frame that cannot be read.
        """
        with self._receive_lock:
            self._ready()
            try:
                limit = self._options.max_frame_bytes
                return self._read_frame(sink, min(limit, max_frame_bytes or limit))
            except TransportError as error:
                self.close()
                log.info("receive failed, connection closed", peer=self.peer, error=str(error))
                raise
            except OSError as error:
                self.close()
                raise TransportError(f"receiving from {self.peer} failed: {error}") from error
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """Close the socket; a thread blocked in `receive` on it wakes with TransportError."""
        with contextlib.suppress(OSError):  # already closed, or never fully connected
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _read_frame(self, sink: TensorSink | None, max_frame_bytes: int) -> Message:
        prefix = self._read_exactly(PREFIX.size, frame_start=True)
        magic, header_bytes, payload = PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise ProtocolMismatch(
                f"{self.peer} does not speak PCP capnp-tcp (it sent {bytes(prefix[:8])!r})"
            )
        _check_size(header_bytes, payload, max_frame_bytes)
        message, headers = header.decode(self._read_exactly(header_bytes), payload)
        for index, tensor in enumerate(headers):
            if sink is None:
                array = np.empty(tensor.shape, header.wire_dtype(tensor.dtype))
                self._read_into(_bytes_of(array))
                cast(_WithTensors, message).tensors.append(Tensor(tensor.name, array))
            else:
                array = _checked_buffer(sink.buffer(index, tensor), tensor)
                self._read_into(_bytes_of(array))
                sink.filled(index, tensor, array)
        return message

    def _write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        for start in range(0, len(view), CHUNK_BYTES):
            chunk = view[start : start + CHUNK_BYTES]
            self._sock.sendall(chunk)
            self.bytes_sent += len(chunk)

    def _read_exactly(self, size: int, *, frame_start: bool = False) -> bytearray:
        data = bytearray(size)
        self._read_into(memoryview(data), frame_start=frame_start)
        return data

    def _read_into(self, view: memoryview, *, frame_start: bool = False) -> None:
        done = 0
        while done < len(view):
            got = self._sock.recv_into(view[done : done + CHUNK_BYTES])
            if got == 0:
                where = "between frames" if frame_start and done == 0 else "mid-frame"
                raise TransportError(f"{self.peer} closed the connection {where}")
            done += got
            self.bytes_received += got


def _check_size(header_bytes: int, payload: int, max_frame_bytes: int) -> None:
    total = PREFIX.size + header_bytes + payload
    if total > max_frame_bytes:
        raise FrameTooLarge(f"frame of {total} bytes is over the limit of {max_frame_bytes}")
    if header_bytes > MAX_HEADER_BYTES:
        raise FrameTooLarge(f"frame header of {header_bytes} bytes is over {MAX_HEADER_BYTES}")


def _wire_array(array: np.ndarray) -> np.ndarray:
    """`array` as C-contiguous little-endian data: itself when it already is."""
    _wire_name(array.dtype)  # refuse what the receiver would refuse, before converting
    return array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)


@cache
def _wire_name(dtype: np.dtype) -> str:
    header.wire_dtype(dtype.name)
    return dtype.name


def _bytes_of(array: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous array (any dtype, 0-d included), sharing its memory."""
    return array.reshape(-1).view(np.uint8).data


def _checked_buffer(array: np.ndarray, tensor: TensorHeader) -> np.ndarray:
    dtype = header.wire_dtype(tensor.dtype)
    if not (
        isinstance(array, np.ndarray)
        and array.dtype == dtype
        and array.shape == tensor.shape
        and array.flags.c_contiguous
        and array.flags.writeable
    ):
        raise ValueError(
            f"sink buffer for tensor {tensor.name!r} must be a writeable C-contiguous "
            f"{dtype} array of shape {tensor.shape}, got {getattr(array, 'dtype', type(array))} "
            f"{getattr(array, 'shape', '')}"
        )
    return array
