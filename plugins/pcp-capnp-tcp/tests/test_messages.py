"""Every message type, and tensors of several dtypes and shapes, cross a real socket intact."""

import dataclasses
import subprocess
import sys

import numpy as np
import pcp_capnp_tcp
import pytest

from pcp_core.plugins import PluginHost
from pcp_core.wire.messages import (
    MESSAGE_TYPES,
    Assignment,
    Audit,
    AuditState,
    Challenge,
    Delta,
    Discard,
    Failure,
    Fetch,
    Heartbeat,
    Hello,
    Proof,
    Ready,
    Reject,
    Result,
    Seal,
    Setup,
    ShardData,
    ShardRequest,
    Stop,
    Tensor,
    Welcome,
)
from pcp_core.wire.transport import TensorHeader


def sample_tensors() -> list[Tensor]:
    return [
        Tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4) / 7),
        Tensor("step", np.array(7, dtype=np.int32)),  # 0-d
        Tensor("empty", np.zeros((0, 5), dtype=np.uint8)),
        Tensor("bytes", np.frombuffer(b"\x00\x01\xfe\xff vmfb", dtype=np.uint8)),
        Tensor("big_endian", np.arange(6, dtype=">i4").reshape(2, 3)),
        Tensor("transposed", np.arange(6, dtype=np.float64).reshape(2, 3).T),
        Tensor("mask", np.array([True, False, True])),
        Tensor("z", np.array([1 + 2j, -3j], dtype=np.complex64)),
    ]


SAMPLES = {
    Hello: Hello("w0", "cpu", "x86-64-v3", '{"iree": "3.13.0"}', "local-task://0", 4),
    Challenge: Challenge(nonce=bytes(range(32))),
    Proof: Proof(mac=b"\x00" * 31 + b"\xff", nonce=b"\x10" * 16),
    Welcome: Welcome(worker_index=3, mac=b"mac\x00", heartbeat_s=7.5),
    Reject: Reject("wrong secret: ünïcödé"),
    Setup: Setup("xla-export", "ab" * 32, '{"batch": 8}', tensors=sample_tensors()),
    Assignment: Assignment(2**40, 500, 3, 8, seed=-17, tensors=sample_tensors(), attempt=2),
    Result: Result(5, 2, [3.5, 2.25, float("inf")], 12.5, norm=7.25, state_digest="cd" * 32),
    Fetch: Fetch(5, 2),
    Discard: Discard(5, 2, "norm over 10x the median"),
    Delta: Delta(5, 2, tensors=sample_tensors()),
    Audit: Audit(5, 2),
    AuditState: AuditState(5, 2, tensors=sample_tensors()),
    Heartbeat: Heartbeat(),
    Seal: Seal(b"\x00seal\xff" * 4),
    Ready: Ready(),
    ShardRequest: ShardRequest("train-00003.bin"),
    ShardData: ShardData("train-00003.bin", 2**33, 2**34, tensors=sample_tensors()[3:4]),
    Stop: Stop(),
    Failure: Failure("out of device memory"),
}


def assert_same(received: object, sent: object) -> None:
    assert type(received) is type(sent)
    for field in dataclasses.fields(sent):
        if field.name != "tensors":
            assert getattr(received, field.name) == getattr(sent, field.name), field.name
    if not hasattr(sent, "tensors"):
        return
    for got, want in zip(received.tensors, sent.tensors, strict=True):
        assert got.name == want.name
        assert got.array.dtype == want.array.dtype.newbyteorder("=")
        assert got.array.shape == want.array.shape
        np.testing.assert_array_equal(got.array, want.array)


def test_samples_cover_every_message_type() -> None:
    assert set(SAMPLES) == set(MESSAGE_TYPES)


@pytest.mark.parametrize("message", SAMPLES.values(), ids=lambda m: type(m).__name__)
def test_message_round_trip(open_pair, transfer, message) -> None:
    _, server, client = open_pair()
    received, sent_bytes = transfer(client, server, message)
    assert_same(received, message)
    assert sent_bytes == client.bytes_sent == server.bytes_received
    # and back the other way on the same connection
    received, _ = transfer(server, client, message)
    assert_same(received, message)


def test_many_messages_in_a_row(open_pair, transfer) -> None:
    _, server, client = open_pair()
    total = 0
    for message in list(SAMPLES.values()) * 3:
        received, sent = transfer(client, server, message)
        assert_same(received, message)
        total += sent
    assert client.bytes_sent == server.bytes_received == total


class Buffers:
    """A TensorSink handing out preallocated arrays and recording what was filled."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.filled_names: list[str] = []

    def buffer(self, index: int, header: TensorHeader) -> np.ndarray:
        return self.arrays[header.name]

    def filled(self, index: int, header: TensorHeader, array: np.ndarray) -> None:
        assert array is self.arrays[header.name]
        self.filled_names.append(header.name)


def test_sink_receives_into_preallocated_buffers(open_pair, transfer) -> None:
    _, server, client = open_pair()
    sent = Delta(1, 3, tensors=sample_tensors())
    buffers = {
        t.name: np.full(t.array.shape, 99, dtype=t.array.dtype.newbyteorder("="))
        for t in sent.tensors
    }
    sink = Buffers(dict(buffers))
    received, _ = transfer(client, server, sent, sink)
    assert received.tensors == []  # the sink took them
    assert (received.round, received.attempt) == (1, 3)
    assert sink.filled_names == [t.name for t in sent.tensors]
    for tensor in sent.tensors:
        assert sink.arrays[tensor.name] is buffers[tensor.name]
        np.testing.assert_array_equal(buffers[tensor.name], tensor.array)


def test_sink_with_a_wrong_buffer_fails_and_closes(open_pair, transfer) -> None:
    _, server, client = open_pair()
    sent = Delta(1, 0, tensors=[Tensor("w", np.ones((2, 2), np.float32))])
    with pytest.raises(ValueError, match="sink buffer for tensor 'w'"):
        transfer(client, server, sent, Buffers({"w": np.ones((2, 2), np.float64)}))
    with pytest.raises(ConnectionError):
        server.receive()


def test_bfloat16_round_trip(open_pair, transfer) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    _, server, client = open_pair()
    array = np.array([[1.5, -2.0], [0.0, 3.25]], dtype=ml_dtypes.bfloat16)
    received, _ = transfer(client, server, Assignment(0, 1, 0, 1, 0, [Tensor("p", array)]))
    assert received.tensors[0].array.dtype == array.dtype
    np.testing.assert_array_equal(received.tensors[0].array, array)


def test_unsupported_dtype_is_refused_before_sending(open_pair) -> None:
    _, _, client = open_pair()
    with pytest.raises(ValueError, match="unsupported tensor dtype 'object'"):
        client.send(Delta(0, 0, [Tensor("o", np.array([object()]))]))
    assert client.bytes_sent == 0


def test_plugin_registers_transport_and_imports_cheaply() -> None:
    assert PluginHost().load().transport("capnp-tcp") is pcp_capnp_tcp.TRANSPORT
    check = "import sys, pcp_capnp_tcp; assert 'capnp' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], check=True)
