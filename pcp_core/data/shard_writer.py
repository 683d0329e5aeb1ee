"""Writing a prepared dataset's token shards as the tokens stream in: `SpanSplitter`
sends the last part of every span to validation and the rest to train, and a
`ShardWriter` per split fills shards of a fixed size, each hashed as it is written and
renamed from `NAME.partial` once complete (`pcp_core.data.prepare` drives them)."""

import hashlib
import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from pcp_core.data import manifest as manifests
from pcp_core.data.manifest import Shard


class ShardWriter:
    """Writes one split's tokens into shards of `shard_tokens`, each hashed as it is
    written and renamed from `NAME.partial` to `NAME` once complete."""

    def __init__(self, directory: Path, split: str, dtype: str, shard_tokens: int) -> None:
        self.directory, self.split = directory, split
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.shard_tokens = shard_tokens
        self.shards: list[Shard] = []
        self._file: BinaryIO | None = None
        self._hash: Any = None
        self._count = 0

    def _path(self, index: int) -> Path:
        return self.directory / manifests.shard_name(self.split, index)

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens):
            if self._file is None:
                partial = self._path(len(self.shards)).with_suffix(".bin.partial")
                # held open across writes, closed by _finish_shard or abort
                self._file = open(partial, "wb")  # noqa: SIM115
                self._hash, self._count = hashlib.sha256(), 0
            room = self.shard_tokens - self._count
            data = tokens[:room].astype(self.dtype).tobytes()
            self._file.write(data)
            self._hash.update(data)
            self._count += min(room, len(tokens))
            tokens = tokens[room:]
            if self._count == self.shard_tokens:
                self._finish_shard()

    def _finish_shard(self) -> None:
        assert self._file is not None and self._hash is not None
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        path = self._path(len(self.shards))
        os.replace(path.with_suffix(".bin.partial"), path)
        nbytes = self._count * self.dtype.itemsize
        self.shards.append(
            Shard(path.name, self.split, self._count, nbytes, self._hash.hexdigest())
        )
        self._file = None

    def close(self) -> None:
        if self._file is not None and self._count:
            self._finish_shard()

    def abort(self) -> None:
        """Remove everything this writer wrote (after an error)."""
        if self._file is not None:
            self._file.close()
            self._path(len(self.shards)).with_suffix(".bin.partial").unlink(missing_ok=True)
            self._file = None
        for shard in self.shards:
            (self.directory / shard.name).unlink(missing_ok=True)
        self.shards = []


class SpanSplitter:
    """Sends the token stream to the train and validation writers: the last `fraction`
    of every `span` tokens to validation. Holds at most one span (a few megabytes)."""

    def __init__(self, fraction: float, span: int, writers: dict[str, ShardWriter]) -> None:
        self.fraction, self.span, self.writers = fraction, span, writers
        self._pending: list[np.ndarray] = []
        self._pending_count = 0
        self.tokens = {"train": 0, "validation": 0}
        self._counts = np.zeros(0, dtype=np.int64)

    def add(self, tokens: np.ndarray) -> None:
        self._pending.append(tokens)
        self._pending_count += len(tokens)
        if self._pending_count >= self.span:
            joined = np.concatenate(self._pending)
            whole = len(joined) - len(joined) % self.span
            for start in range(0, whole, self.span):
                self._route(joined[start : start + self.span])
            self._pending = [joined[whole:]]
            self._pending_count = len(joined) - whole

    def finish(self) -> None:
        if self._pending_count:
            self._route(np.concatenate(self._pending))
        self._pending, self._pending_count = [], 0

    def _route(self, span: np.ndarray) -> None:
        cut = int(len(span) * (1 - self.fraction))
        train = span[:cut]
        self.writers["train"].write(train)
        self.writers["validation"].write(span[cut:])
        self.tokens["train"] += len(train)
        self.tokens["validation"] += len(span) - cut
        counts = np.bincount(train)
        if len(counts) > len(self._counts):
            counts[: len(self._counts)] += self._counts
            self._counts = counts
        else:
            self._counts[: len(counts)] += counts

    def train_entropy(self) -> float:
        """Entropy in nats of the train tokens: the loss of a model with no context."""
        counts = self._counts[self._counts > 0].astype(np.float64)
        if not len(counts):
            return 0.0
        p = counts / counts.sum()
        return float(-(p * np.log(p)).sum())
