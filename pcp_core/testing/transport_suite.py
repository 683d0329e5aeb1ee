"""The transport conformance suite. A transport package proves itself in three lines:

    class TestMyTransport(TransportConformance):
        transport_name = "mine"

Over 127.0.0.1 it checks what the shepherd and the workers rely on: the listener
reports its real port, accept times out, every message type crosses both ways with
its tensors bit-exact (into a caller's buffers too), both ends count bytes, a frame
over the limit is refused by the sender and over a receiver's own lower limit by the
receiver, the core's sealed channel works over it and refuses a replayed message, and a
peer that closes is a `TransportError`.
"""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import numpy as np
import pytest

from pcp_core.wire import messages
from pcp_core.wire.channel import SealedConnection, TamperedMessage
from pcp_core.wire.transport import FrameTooLarge, TensorHeader, TransportError, TransportOptions

OPTIONS = TransportOptions(max_frame_bytes=2**20, timeout_s=10)


def sample_messages() -> list[Any]:
    tensors = [
        messages.Tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4)),
        messages.Tensor("tokens", np.arange(7, dtype=np.int32)),
    ]
    return [
        messages.Hello("worker-a", "cpu", "host", '{"iree": "3.13.0"}', "cpu0", previous_index=2),
        messages.Challenge(b"\x00nonce\xff"),
        messages.Proof(b"mac" * 8, b"nonce"),
        messages.Welcome(3, b"mac" * 8, 2.5),
        messages.Fetch(2, 1),
        messages.Discard(2, 1, "stale"),
        messages.Reject("no"),
        messages.Setup("iree-vmfb", "ab" * 32, '{"k": 1}', tensors),
        messages.Assignment(2, 50, 1, 4, 7, tensors, attempt=1),
        messages.Result(2, 1, [1.5, 1.25], 0.5, 3.25),
        messages.Delta(2, 1, tensors),
        messages.Heartbeat(),
        messages.Seal(b"\x01seal" * 6),
        messages.Ready(),
        messages.ShardRequest("train-00001.bin"),
        messages.ShardData("train-00001.bin", 4096, 8192, [tensors[1]]),
        messages.Stop("done"),
        messages.Failure("it broke"),
    ]


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    for key, value in vars(a).items():
        other = getattr(b, key)
        if key == "tensors":
            pairs = list(zip(value, other, strict=True))
            if any(x.name != y.name or x.array.dtype != y.array.dtype for x, y in pairs):
                return False
            if any(not np.array_equal(x.array, y.array) for x, y in pairs):
                return False
        elif value != other:
            return False
    return True


class BufferSink:
    """A TensorSink that receives every tensor into its own preallocated array."""

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []

    def buffer(self, index: int, header: TensorHeader) -> np.ndarray:
        self.arrays.append(np.empty(header.shape, np.dtype(header.dtype)))
        return self.arrays[-1]

    def filled(self, index: int, header: TensorHeader, array: np.ndarray) -> None:
        assert array is self.arrays[index]


class TransportConformance:
    transport_name: ClassVar[str]

    @pytest.fixture
    def transport(self) -> Any:
        from pcp_core import plugins

        return plugins.host().transport(self.transport_name)

    @pytest.fixture
    def pair(self, transport: Any) -> Iterator[tuple[Any, Any, Any]]:
        """A listener, its side of one connection, and the connecting side."""
        listener = transport.listen("127.0.0.1", 0, OPTIONS)
        with ThreadPoolExecutor(1) as pool:
            accepted = pool.submit(listener.accept, 10)
            client = transport.connect(*listener.address, OPTIONS)
            server = accepted.result()
        yield listener, server, client
        for thing in (client, server, listener):
            thing.close()

    @staticmethod
    def transfer(sender: Any, receiver: Any, message: Any, sink: Any = None) -> Any:
        with ThreadPoolExecutor(1) as pool:
            sending = pool.submit(sender.send, message)
            received = receiver.receive(sink)
            sending.result()
            return received

    def test_listener_reports_its_port_and_accept_times_out(self, transport: Any) -> None:
        listener = transport.listen("127.0.0.1", 0, OPTIONS)
        try:
            assert listener.address[1] > 0
            with pytest.raises(TimeoutError):
                listener.accept(timeout_s=0.05)
        finally:
            listener.close()

    def test_every_message_crosses_both_ways(self, pair: tuple[Any, Any, Any]) -> None:
        _, server, client = pair
        for message in sample_messages():
            assert same(self.transfer(client, server, message), message), message
            assert same(self.transfer(server, client, message), message), message
        assert client.bytes_sent > 0 and client.bytes_received > 0
        assert server.bytes_received == client.bytes_sent

    def test_tensors_land_in_the_callers_buffers(self, pair: tuple[Any, Any, Any]) -> None:
        _, server, client = pair
        message = next(m for m in sample_messages() if isinstance(m, messages.Delta))
        sink = BufferSink()
        received = self.transfer(client, server, message, sink)
        assert len(sink.arrays) == len(message.tensors)
        for ours, theirs in zip(sink.arrays, message.tensors, strict=True):
            np.testing.assert_array_equal(ours, theirs.array)
        assert (received.round, received.attempt) == (message.round, message.attempt)

    def test_a_frame_over_the_limit_is_refused(self, pair: tuple[Any, Any, Any]) -> None:
        _, server, client = pair
        big = messages.Delta(1, 0, [messages.Tensor("big", np.zeros(2**19, np.float32))])
        with pytest.raises(FrameTooLarge):
            client.send(big)  # refused before a byte is sent: the connection stays usable
        assert same(self.transfer(client, server, messages.Stop()), messages.Stop())

    def test_a_receiver_can_lower_the_limit(self, pair: tuple[Any, Any, Any]) -> None:
        _, server, client = pair
        message = messages.Setup("k", "ab", "{}", [messages.Tensor("t", np.zeros(4096, np.uint8))])
        with ThreadPoolExecutor(1) as pool:
            sending = pool.submit(client.send, message)
            with pytest.raises(TransportError):  # FrameTooLarge, or the connection closed
                server.receive(max_frame_bytes=1024)
            sending.exception()

    def test_the_sealed_channel_runs_over_it(self, pair: tuple[Any, Any, Any]) -> None:
        _, server, client = pair
        sealed_client = SealedConnection(client, b"c" * 32, b"s" * 32)
        sealed_server = SealedConnection(server, b"s" * 32, b"c" * 32)
        for message in sample_messages():
            assert same(self.transfer(sealed_client, sealed_server, message), message), message
            assert same(self.transfer(sealed_server, sealed_client, message), message), message
        delta = next(m for m in sample_messages() if isinstance(m, messages.Delta))
        sink = BufferSink()
        self.transfer(sealed_client, sealed_server, delta, sink)
        np.testing.assert_array_equal(sink.arrays[0], delta.tensors[0].array)
        replayed = SealedConnection(client, b"c" * 32, b"s" * 32)  # starts again at 0
        with pytest.raises(TamperedMessage):
            self.transfer(replayed, sealed_server, messages.Stop("from a replay"))

    def test_a_closed_peer_is_a_transport_error(self, pair: tuple[Any, Any, Any]) -> None:
        _, server, client = pair
        client.close()
        with pytest.raises(TransportError):
            server.receive()
