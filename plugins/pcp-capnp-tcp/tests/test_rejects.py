"""Frames that must be refused: too large, another version, garbage, cut short.

Each is refused before its payload is read (checked through `bytes_received`) and
closes only its own connection.
"""

import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from pcp_capnp_tcp import connect, header, listen
from pcp_capnp_tcp.connection import MAGIC, PREFIX

from pcp_core.wire.messages import PROTOCOL_VERSION, Delta, Stop, Tensor
from pcp_core.wire.transport import (
    FrameTooLarge,
    ProtocolMismatch,
    TensorHeader,
    TransportError,
    TransportOptions,
)

MiB = 2**20


@pytest.fixture
def listener():
    listener = listen("127.0.0.1", 0, TransportOptions(max_frame_bytes=MiB, timeout_s=10))
    yield listener
    listener.close()


def raw_peer(listener) -> tuple[socket.socket, object]:
    """A plain socket that writes whatever a test wants, and the listener's side of it."""
    raw = socket.create_connection(listener.address)
    return raw, listener.accept(10)


def frame(encoded: bytes, payload: int, magic: bytes = MAGIC) -> bytes:
    return PREFIX.pack(magic, len(encoded), payload) + encoded


def test_oversized_frame_rejected_before_payload_other_connection_unaffected(
    listener, transfer
) -> None:
    big = connect(*listener.address, TransportOptions(timeout_s=10))
    big_server = listener.accept(10)
    small = connect(*listener.address, TransportOptions(timeout_s=10))
    small_server = listener.accept(10)
    oversized = Delta(0, 0, [Tensor("g", np.zeros(64 * MiB, np.uint8))])
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(big.send, oversized)
        with pytest.raises(FrameTooLarge, match="over the limit of 1048576"):
            big_server.receive()
        assert big_server.bytes_received == PREFIX.size  # neither header nor payload read
        with pytest.raises(TransportError):  # the shepherd closed on it mid-send
            sending.result()
    with pytest.raises(TransportError):
        big_server.receive()  # closed
    fits = Delta(1, 0, [Tensor("g", np.arange(1000, dtype=np.float32))])
    received, _ = transfer(small, small_server, fits)
    np.testing.assert_array_equal(received.tensors[0].array, fits.tensors[0].array)
    late = connect(*listener.address, TransportOptions(timeout_s=10))
    late_server = listener.accept(10)
    assert transfer(late, late_server, Stop())[0] == Stop()
    for connection in (big, small, small_server, late, late_server):
        connection.close()


def test_sender_refuses_frame_over_its_own_limit_and_stays_usable(listener, transfer) -> None:
    client = connect(*listener.address, TransportOptions(max_frame_bytes=MiB))
    server = listener.accept(10)
    with pytest.raises(FrameTooLarge):
        client.send(Delta(0, 0, [Tensor("g", np.zeros(2 * MiB, np.uint8))]))
    assert client.bytes_sent == 0
    assert transfer(client, server, Stop("bye"))[0] == Stop("bye")
    client.close()
    server.close()


def bad_version_header() -> bytes:
    built = header.schema().Frame.new_message(version=PROTOCOL_VERSION + 1)
    built.message.init("stop").reason = "from the future"
    return built.to_bytes()


def tensor_header(name="t", dtype="float32", shape=(4,), nbytes=16) -> TensorHeader:
    return TensorHeader(name, dtype, shape, nbytes)


@pytest.mark.parametrize(
    ("encoded", "payload", "error", "match"),
    [
        (bad_version_header(), 0, ProtocolMismatch, f"version {PROTOCOL_VERSION + 1}"),
        (b"\x00" * 8 + b"\xff" * 24, 0, TransportError, "malformed frame header"),
        (b"\x00" * 4 + b"\xff" * 28, 0, TransportError, "malformed frame header"),
        (
            header.encode(Delta(0, 0), [tensor_header(nbytes=15)]),
            15,
            TransportError,
            "is 16 bytes, its header says 15",
        ),
        (
            header.encode(Delta(0, 0), [tensor_header()]),
            17,
            TransportError,
            "add up to 16 bytes, the frame prefix says 17",
        ),
        (
            header.encode(Delta(0, 0), [tensor_header(dtype="object", nbytes=32)]),
            32,
            TransportError,
            "unsupported tensor dtype 'object'",
        ),
        (
            header.encode(Delta(0, 0), [tensor_header(dtype="f4")]),
            16,
            TransportError,
            "unsupported tensor dtype 'f4'",
        ),
        (
            header.encode(Delta(0, 0), [tensor_header(shape=(0, 2**62), nbytes=0)]),
            0,
            TransportError,
            "impossible shape",
        ),
        (
            header.encode(Delta(0, 0), [tensor_header(shape=(1,) * 33, nbytes=4)]),
            4,
            TransportError,
            "impossible shape",
        ),
        (
            header.encode(Stop(), [tensor_header()]),
            16,
            TransportError,
            "a Stop carries no tensors",
        ),
    ],
    ids=[
        "version",
        "garbage-header",
        "garbage-segments",
        "nbytes",
        "payload",
        "dtype",
        "alias",
        "empty-but-huge",
        "too-many-dims",
        "tensors-on-stop",
    ],
)
def test_bad_header_rejected_before_payload(listener, encoded, payload, error, match) -> None:
    raw, server = raw_peer(listener)
    raw.sendall(frame(encoded, payload) + b"\x00" * payload)
    with pytest.raises(error, match=match):
        server.receive()
    assert server.bytes_received == PREFIX.size + len(encoded)
    raw.close()


def test_garbage_bytes_rejected(listener) -> None:
    raw, server = raw_peer(listener)
    raw.sendall(b"GET / HTTP/1.1\r\nHost: shepherd\r\n\r\n")
    with pytest.raises(ProtocolMismatch, match="does not speak PCP capnp-tcp"):
        server.receive()
    with pytest.raises(TransportError):
        server.receive()
    raw.close()


def test_huge_declared_header_rejected(listener) -> None:
    raw, server = raw_peer(listener)
    raw.sendall(PREFIX.pack(MAGIC, 2**32 - 1, 0))
    with pytest.raises(FrameTooLarge):
        server.receive()
    raw.close()


def test_peer_disconnect_mid_frame(listener) -> None:
    raw, server = raw_peer(listener)
    encoded = header.encode(Delta(0, 0), [tensor_header(shape=(MiB // 8,), nbytes=MiB // 2)])
    raw.sendall(frame(encoded, MiB // 2) + b"\x01" * 1000)
    raw.close()
    with pytest.raises(TransportError, match="closed the connection mid-frame"):
        server.receive()
    assert server.bytes_received == PREFIX.size + len(encoded) + 1000


def test_peer_disconnect_inside_prefix(listener) -> None:
    raw, server = raw_peer(listener)
    raw.sendall(MAGIC)
    raw.close()
    with pytest.raises(TransportError, match="mid-frame"):
        server.receive()


def test_peer_disconnect_between_frames(listener, transfer) -> None:
    client = connect(*listener.address, TransportOptions())
    server = listener.accept(10)
    transfer(client, server, Stop())
    client.close()
    with pytest.raises(TransportError, match="closed the connection between frames"):
        server.receive()


def test_receive_timeout_is_a_transport_error() -> None:
    listener = listen("127.0.0.1", 0, TransportOptions(timeout_s=0.2))
    raw = socket.create_connection(listener.address)
    server = listener.accept(10)
    with pytest.raises(TransportError, match="timed out"):
        server.receive()
    raw.close()
    listener.close()
