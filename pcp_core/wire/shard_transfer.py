"""Getting a prepared dataset's shards to the workers without sending the corpus whole.

The shepherd gives each worker a share of the training shards (`assign_shards`) and
names them, with their sha256, in the worker's Setup. A worker that has the dataset on
its disk (`pcp worker --data DIR`) checks those shards there against the shepherd's
hashes; otherwise it asks for each one it lacks (ShardRequest) and the shepherd streams
it in chunks (ShardData), which the worker writes to a cache keyed by content hash, so a
restarted worker fetches nothing twice. The shepherd serves a worker only the shards it
assigned that worker.
"""

import dataclasses
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from pcp_core.data.errors import DataError
from pcp_core.data.manifest import Shard, parse_manifest, sha256_file
from pcp_core.data.shards import PreparedDataset
from pcp_core.wire.messages import ShardData, ShardRequest, Tensor

log = structlog.get_logger(__name__)

CHUNK_BYTES = 4 * 2**20  # one ShardData frame: small next to a model, big enough to stream
CHUNK_FRAME_BYTES = CHUNK_BYTES + 64 * 2**10  # what a worker accepts per ShardData frame


def training_shards(dataset: Any) -> dict[str, Path] | None:
    """A prepared dataset's training shards, by name, with the files the shepherd reads;
    None for a dataset that travels whole in the Setup (a text corpus)."""
    if not isinstance(dataset, PreparedDataset):
        return None
    return {shard.name: dataset.path(shard.name) for shard in dataset.shards("train")}


def worker_manifest(dataset: Any, names: list[str]) -> dict[str, Any]:
    """The manifest a worker is sent: its share of the training shards (and one
    validation shard, which a manifest must name, though workers never read it), no
    input list, so the Setup does not grow with the corpus."""
    manifest = dataset.manifest
    chosen = set(names)
    shards = [s for s in manifest.shards_of("train") if s.name in chosen]
    shards += manifest.shards_of("validation")[:1]
    return dataclasses.replace(manifest, shards=shards, inputs=[]).to_dict()


def shard_dataset(raw_manifest: dict[str, Any], source: "ShardSource") -> Any:
    """The worker's dataset: the shepherd's manifest, its training shards read from
    `source` (the local copy, the cache, or fetched)."""
    manifest = parse_manifest(raw_manifest, "the shepherd's manifest")
    train = manifest.shards_of("train")
    paths = source.obtain(train)
    where = source.local_dir or source.cache_dir
    return PreparedDataset(where, manifest, [s.name for s in train], paths)


def assign_shards(names: list[str], worker: int, workers: int) -> list[str]:
    """Worker `worker`'s share of the training shards `names`: every `workers`-th one,
    so shares are disjoint; with fewer shards than workers, workers share them."""
    if len(names) >= workers:
        return names[worker % workers :: workers]
    return [names[worker % len(names)]]


def default_shard_cache() -> Path:
    """Fetched shards: `$PCP_CACHE_DIR/shards`, else the user cache directory's. Each is
    checked against its sha256 when used, so the cache needs no more trust than that."""
    override = os.environ.get("PCP_CACHE_DIR")
    if override:
        return Path(override) / "shards"
    import platformdirs

    return Path(platformdirs.user_cache_dir("pcp")) / "shards"


def serve_shard(
    send: Callable[[Any], int], request: ShardRequest, assigned: dict[str, Path]
) -> int:
    """Stream the requested shard in chunks; ValueError if it is not one of `assigned`
    (the worker's share). Returns the bytes sent."""
    path = assigned.get(request.name)
    if path is None:
        raise ValueError(
            f"asked for shard {request.name[:80]!r}, not one of its assigned shards left to send"
        )
    size, sent, offset = path.stat().st_size, 0, 0
    with open(path, "rb") as file:
        while True:
            chunk = file.read(CHUNK_BYTES)
            if not chunk and offset < size:
                raise ValueError(f"shard {request.name} is shorter than it was ({path})")
            tensor = Tensor("bytes", np.frombuffer(chunk, dtype=np.uint8))
            sent += send(ShardData(request.name, offset, size, [tensor]))
            offset += len(chunk)
            if offset >= size:
                return sent


@dataclass
class ShardSource:
    """Where a worker gets its assigned shards: its own copy of the dataset, else the
    shepherd through `request` (send a message) and `receive` (the next message)."""

    local_dir: Path | None
    cache_dir: Path
    send: Callable[[Any], int]
    receive: Callable[..., Any]  # receive(max_frame_bytes=...)
    fetched: list[str] | None = None  # the shards it asked the shepherd for

    def obtain(self, entries: list[Shard]) -> dict[str, Path]:
        """Each entry's file, its sha256 checked against the shepherd's."""
        self.fetched = []
        return {entry.name: self._path(entry) for entry in entries}

    def _path(self, entry: Shard) -> Path:
        if self.local_dir is not None:
            path = self.local_dir / entry.name
            if not path.is_file():
                raise DataError(f"{self.local_dir} has no shard {entry.name}: not the same dataset")
            if sha256_file(path) != entry.sha256:
                raise DataError(
                    f"{path} differs from the shepherd's shard (sha256 mismatch): "
                    "not the same dataset; prepare it again or leave --data out to fetch it"
                )
            return path
        cached = self.cache_dir / entry.sha256
        if cached.is_file() and sha256_file(cached) == entry.sha256:
            log.info("shard from the cache", shard=entry.name)
            return cached
        self._fetch(entry, cached)
        return cached

    def _fetch(self, entry: Shard, destination: Path) -> None:
        partial = destination.with_name(f"{destination.name}.{os.getpid()}.part")
        try:
            destination.parent.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as file:
                self.send(ShardRequest(entry.name))
                digest = self._receive_into(file, entry)
            if digest != entry.sha256:
                raise DataError(f"shard {entry.name} arrived damaged (sha256 mismatch)")
            os.replace(partial, destination)
        except OSError as error:
            raise DataError(
                f"cannot keep shard {entry.name} in {destination.parent}: "
                f"{error.strerror or error}; choose another --shard-cache"
            ) from None
        finally:
            partial.unlink(missing_ok=True)
        assert self.fetched is not None
        self.fetched.append(entry.name)
        log.info("shard fetched", shard=entry.name, bytes=entry.nbytes)

    def _receive_into(self, file: Any, entry: Shard) -> str:
        """Write the shard's chunks to `file` as they come; returns their sha256."""
        digest, received = hashlib.sha256(), 0
        while True:
            chunk = self.receive(max_frame_bytes=CHUNK_FRAME_BYTES)
            if not isinstance(chunk, ShardData) or chunk.name != entry.name:
                raise DataError(f"expected shard {entry.name}, got {type(chunk).__name__}")
            if chunk.offset != received or chunk.size != entry.nbytes:
                raise DataError(f"shard {entry.name}: chunk out of order or of another size")
            data = chunk.tensors[0].array.tobytes() if chunk.tensors else b""
            if not data and received < entry.nbytes:
                raise DataError(f"shard {entry.name}: an empty chunk before the end")
            received += len(data)
            if received > entry.nbytes:
                raise DataError(f"shard {entry.name}: more bytes than announced")
            file.write(data)
            digest.update(data)
            if received == entry.nbytes:
                return digest.hexdigest()
