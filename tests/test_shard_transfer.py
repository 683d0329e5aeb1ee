"""Shards between shepherd and worker: shares, streaming, checking, caching."""

import hashlib
from pathlib import Path

import numpy as np
import pytest

from pcp_core.data.errors import DataError
from pcp_core.data.manifest import Manifest, Shard
from pcp_core.wire import shard_transfer
from pcp_core.wire.messages import ShardData, ShardRequest, Tensor
from pcp_core.wire.shard_transfer import ShardSource, assign_shards, serve_shard


def test_shares_are_disjoint_and_cover_every_shard() -> None:
    names = [f"train-{i:05d}.bin" for i in range(7)]
    shares = [assign_shards(names, worker, 3) for worker in range(3)]
    assert sorted(name for share in shares for name in share) == names
    assert assign_shards(names, 4, 3) == shares[1]  # an index past the count wraps
    assert assign_shards(names[:1], 2, 3) == names[:1]  # fewer shards than workers: shared


def shard_file(folder: Path, name: str, size: int) -> tuple[Path, Shard]:
    path = folder / name
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return path, Shard(name, "train", size // 2, size, hashlib.sha256(data).hexdigest())


class Pipe:
    """The worker's end of a connection whose shepherd serves `assigned`."""

    def __init__(self, assigned: dict[str, Path]) -> None:
        self.assigned, self.inbox, self.requests = assigned, [], []

    def send(self, message: object) -> int:
        assert isinstance(message, ShardRequest)
        self.requests.append(message.name)
        return serve_shard(self.deliver, message, self.assigned)

    def deliver(self, message: ShardData) -> int:
        self.inbox.append(message)
        return message.tensors[0].array.nbytes

    def receive(self, max_frame_bytes: int | None = None) -> ShardData:
        assert max_frame_bytes == shard_transfer.CHUNK_FRAME_BYTES
        return self.inbox.pop(0)


def test_a_shard_streams_in_chunks_into_the_cache_and_is_fetched_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_transfer, "CHUNK_BYTES", 1000)
    path, shard = shard_file(tmp_path, "train-00000.bin", 4500)
    pipe = Pipe({shard.name: path})
    source = ShardSource(None, tmp_path / "cache", pipe.send, pipe.receive)
    got = source.obtain([shard])
    assert got[shard.name].read_bytes() == path.read_bytes()
    assert got[shard.name].name == shard.sha256 and source.fetched == [shard.name]
    assert pipe.requests == [shard.name]
    again = ShardSource(None, tmp_path / "cache", pipe.send, pipe.receive)
    again.obtain([shard])
    assert pipe.requests == [shard.name] and again.fetched == []  # from the cache


def test_the_shepherd_refuses_a_shard_it_did_not_assign(tmp_path: Path) -> None:
    path, shard = shard_file(tmp_path, "train-00000.bin", 100)
    with pytest.raises(ValueError, match="not one of its assigned"):
        serve_shard(lambda m: 0, ShardRequest("train-00001.bin"), {shard.name: path})
    with pytest.raises(ValueError, match="not one of its assigned"):
        serve_shard(lambda m: 0, ShardRequest("../manifest.json"), {shard.name: path})


def test_a_damaged_shard_is_refused_and_not_cached(tmp_path: Path) -> None:
    path, shard = shard_file(tmp_path, "train-00000.bin", 300)
    damaged = bytearray(path.read_bytes())
    damaged[5] ^= 1
    replies = [ShardData(shard.name, 0, 300, [Tensor("bytes", np.frombuffer(damaged, np.uint8))])]
    source = ShardSource(None, tmp_path / "cache", lambda m: 0, lambda **_: replies.pop(0))
    with pytest.raises(DataError, match="damaged"):
        source.obtain([shard])
    assert not any((tmp_path / "cache").iterdir())


def test_a_local_copy_is_checked_against_the_shepherds_hash(tmp_path: Path) -> None:
    path, shard = shard_file(tmp_path, "train-00000.bin", 300)
    never = ShardSource(tmp_path, tmp_path / "cache", lambda m: pytest.fail("fetched"), list)
    assert never.obtain([shard]) == {shard.name: path}
    path.write_bytes(b"\x00" * 300)
    with pytest.raises(DataError, match="sha256 mismatch"):
        never.obtain([shard])
    with pytest.raises(DataError, match=r"no shard train-00009\.bin"):
        never.obtain([Shard("train-00009.bin", "train", 1, 2, "0" * 64)])


def test_a_shard_hash_that_is_not_a_hash_is_refused_before_it_names_a_file(
    tmp_path: Path,
) -> None:
    """A shepherd's manifest names cache files by sha256: "../x" must not get that far."""
    _, shard = shard_file(tmp_path, "train-00000.bin", 300)
    validation = Shard("val-00000.bin", "validation", 10, 20, "0" * 64)
    manifest = Manifest(
        '{"kind": "bytes"}', 256, "uint16", 0.1, 2**20, [shard, validation], [], 1.0
    )
    raw = manifest.to_dict()
    raw["shards"][0]["sha256"] = "../../escaped"
    source = ShardSource(None, tmp_path / "cache", lambda m: pytest.fail("fetched"), list)
    with pytest.raises(DataError, match="no valid sha256"):
        shard_transfer.shard_dataset(raw, source)
    assert not (tmp_path / "cache").exists() and not (tmp_path.parent / "escaped").exists()
