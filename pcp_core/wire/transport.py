"""What a transport plugin provides: listening, connecting, and moving `messages`.

Receiving takes an optional `TensorSink`, so a receiver can say where each tensor's
bytes go before they are read: the shepherd reads pseudo-gradients into one scratch
buffer per tensor and adds them into its running sum, instead of holding every
worker's copy.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from pcp_core.wire.messages import Message


class TransportError(ConnectionError):
    """A broken, refused or malformed connection or frame."""


class FrameTooLarge(TransportError):
    """A frame over the configured size limit."""


class ProtocolMismatch(TransportError):
    """A peer speaking another protocol version."""


@dataclass(frozen=True)
class TensorHeader:
    name: str
    dtype: str  # numpy dtype name, little-endian on the wire
    shape: tuple[int, ...]
    nbytes: int


class TensorSink(Protocol):
    def buffer(self, index: int, header: TensorHeader) -> np.ndarray:
        """A C-contiguous array of header.dtype/shape that the bytes are read into."""
        ...

    def filled(self, index: int, header: TensorHeader, array: np.ndarray) -> None:
        """Called once `array` holds the tensor's bytes."""
        ...


@dataclass(frozen=True)
class TransportOptions:
    max_frame_bytes: int = 64 * 2**30  # whole frame: metadata plus tensor bytes
    timeout_s: float | None = None  # per blocking socket operation; None waits forever
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None


class Connection(Protocol):
    peer: str

    # Counted by the transport's connection; its users and wrappers only read them.
    @property
    def bytes_sent(self) -> int: ...

    @property
    def bytes_received(self) -> int: ...

    def send(self, message: Message) -> int:
        """Send one message; returns the bytes written for it."""
        ...

    def receive(
        self, sink: TensorSink | None = None, max_frame_bytes: int | None = None
    ) -> Message:
        """The next message; its tensors hold fresh arrays unless a sink takes them.

        `max_frame_bytes` lowers the options' frame limit for this message alone: the
        shepherd reads a joining peer's first messages under a small one, before it has
        proved anything.
        """
        ...

    def close(self) -> None: ...


class Listener(Protocol):
    address: tuple[str, int]  # the bound host and port (port 0 resolves to the real one)

    def accept(self, timeout_s: float | None = None) -> Connection:
        """The next connection (TLS-wrapped when configured); TimeoutError if none came."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Transport:
    name: str
    listen: Callable[[str, int, TransportOptions], Listener]
    connect: Callable[[str, int, TransportOptions], Connection]
    description: str = ""
    # Its own settings, if any: a dataclass of `pcp_core.settings.setting` fields (flags
    # and a TOML section named after it); read with `config.settings(name)`.
    settings: type | None = None
