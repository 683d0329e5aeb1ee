"""The seal over a message (pcp_core.wire.channel): every byte of every tensor counts,
though large tensors enter it as the digests of their chunks, hashed on several cores."""

import hashlib

import numpy as np
import pytest

from pcp_core.wire.channel import DIGEST_CHUNK_BYTES, chunk_digests, seal_of
from pcp_core.wire.messages import Delta, Tensor

KEY = b"k" * 32


def delta(array: np.ndarray, name: str = "w") -> Delta:
    return Delta(round=3, attempt=0, tensors=[Tensor(name, array)])


@pytest.mark.parametrize("size", [0, 5, DIGEST_CHUNK_BYTES, 3 * DIGEST_CHUNK_BYTES + 7])
def test_chunk_digests_cover_every_chunk_in_order(size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    chunks = [data[i : i + DIGEST_CHUNK_BYTES] for i in range(0, size, DIGEST_CHUNK_BYTES)]
    expected = (
        b"".join(hashlib.sha256(c).digest() for c in chunks)
        if len(chunks) > 1
        else hashlib.sha256(data).digest()
    )
    assert chunk_digests(memoryview(data)) == expected


def test_any_changed_byte_name_or_shape_changes_the_seal() -> None:
    """A tensor of three whole chunks and a tail: a flipped byte in any chunk, in the
    tail, or another name, shape or round gives another seal; the same message the same."""
    array = np.random.default_rng(0).standard_normal(3 * DIGEST_CHUNK_BYTES // 4 + 3)
    array = array.astype(np.float32)
    sealed = seal_of(KEY, 7, delta(array))
    assert seal_of(KEY, 7, delta(array.copy())) == sealed
    raw = array.view(np.uint8)
    for position in (0, DIGEST_CHUNK_BYTES + 1, 2 * DIGEST_CHUNK_BYTES + 5, raw.size - 1):
        changed = raw.copy()
        changed[position] ^= 1
        assert seal_of(KEY, 7, delta(changed.view(np.float32))) != sealed, position
    assert seal_of(KEY, 7, delta(array, name="v")) != sealed
    assert seal_of(KEY, 7, delta(array[:-1])) != sealed
    assert seal_of(KEY, 8, delta(array)) != sealed
    assert seal_of(b"j" * 32, 7, delta(array)) != sealed
    other_round = Delta(round=4, attempt=0, tensors=[Tensor("w", array)])
    assert seal_of(KEY, 7, other_round) != sealed
