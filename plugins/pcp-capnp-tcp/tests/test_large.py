"""A multi-GiB frame (one tensor over 2 GiB, one over 512 MiB) crosses intact."""

import zlib

import numpy as np
import pytest

from pcp_core.wire.messages import Assignment, Tensor

MiB = 2**20


def crc(array: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8)))


@pytest.mark.slow
def test_three_gib_frame_crosses_intact(open_pair, transfer) -> None:
    # Every tensor is a view into one patterned buffer at its own offset, so the
    # sender holds 2.2 GiB for a 3 GiB frame and every tensor's bytes differ.
    huge_bytes = 2048 * MiB + 100 * MiB
    base = np.arange(huge_bytes // 8 + MiB, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    raw = base.view(np.uint8)
    tensors = [
        Tensor("huge", raw[:huge_bytes]),
        Tensor("big", raw[64 : 64 + 600 * MiB].view(np.float32).reshape(-1, 1024)),
        *(
            Tensor(f"layer{i}", raw[(i + 1) * 8 * MiB + 8 * i :][: 48 * MiB].view(np.int32))
            for i in range(8)
        ),
        Tensor("scalar", np.array(1.5, np.float32)),
        Tensor("empty", np.zeros((0, 3), np.int32)),
    ]
    checksums = [crc(tensor.array) for tensor in tensors]
    sent = Assignment(1, 100, 0, 1, 0, tensors)
    total = sum(tensor.array.nbytes for tensor in tensors)
    assert total > 3 * 2**30

    _, server, client = open_pair()
    received, sent_bytes = transfer(client, server, sent)
    del sent, tensors, base, raw

    assert sent_bytes == server.bytes_received > total
    assert [tensor.name for tensor in received.tensors][:2] == ["huge", "big"]
    assert received.tensors[1].array.shape == (600 * MiB // 4096, 1024)
    assert [crc(tensor.array) for tensor in received.tensors] == checksums
