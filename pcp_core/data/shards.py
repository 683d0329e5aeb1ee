"""A dataset written by `pcp data prepare`, read through memory maps.

`PreparedDataset` offers what training uses of `CharCorpus` (`source`, `vocab_size`,
`tokenizer`, `batches`, `check_block_size`, `unigram_entropy`, `decode`) without ever
loading a shard whole: batches read only the windows they need from `np.memmap`s. A
distributed worker opens the dataset restricted to the train shards it was given
(`restricted`) and can check them against the manifest first (`verify`).
"""

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import structlog

from pcp_core.data.errors import DataError
from pcp_core.data.manifest import Manifest, Shard, read_manifest, sha256_file
from pcp_core.data.tokenizers import Tokenizer, from_json

log = structlog.get_logger(__name__)


class PreparedDataset:
    """Token shards of DIR/manifest.json: train (all, or the ones named) and validation.

    `paths` says where shard files are when they are not DIR/NAME (a worker's shards
    fetched into a cache by hash); a shard is opened only when first read.
    """

    def __init__(
        self,
        directory: Path,
        manifest: Manifest,
        train_names: Sequence[str] | None = None,
        paths: Mapping[str, Path] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.manifest = manifest
        self.paths = dict(paths or {})
        self.tokenizer: Tokenizer = from_json(manifest.tokenizer)
        train = manifest.shards_of("train")
        if train_names is not None:
            known = {s.name: s for s in train}
            unknown = [n for n in train_names if n not in known]
            if unknown:
                raise DataError(f"{self.directory} has no train shard {unknown[0]}")
            if not train_names:
                raise DataError(f"{self.directory}: no train shard chosen")
            train = [known[n] for n in dict.fromkeys(train_names)]
        self._shards = {"train": train, "validation": manifest.shards_of("validation")}
        self._maps: dict[str, np.memmap] = {}
        self.source = str(self.directory)

    @classmethod
    def open(cls, directory: Path) -> "PreparedDataset":
        return cls(Path(directory), read_manifest(Path(directory)))

    def restricted(self, train_names: Sequence[str]) -> "PreparedDataset":
        """The same dataset, sampling its train batches only from the named shards."""
        return PreparedDataset(self.directory, self.manifest, train_names, self.paths)

    def path(self, name: str) -> Path:
        """Where the shard `name` is read from."""
        return self.paths.get(name, self.directory / name)

    @property
    def vocab_size(self) -> int:
        return self.manifest.vocab_size

    def shards(self, split: str) -> list[Shard]:
        """The shards of `split` ("train" or "validation") this dataset reads."""
        return list(self._shards[_split(split)])

    def tokens(self, split: str) -> int:
        return sum(s.tokens for s in self._shards[_split(split)])

    def unigram_entropy(self) -> float:
        """Entropy in nats of the whole train split (counted when it was prepared)."""
        return self.manifest.train_unigram_entropy

    def decode(self, tokens: np.ndarray) -> str:
        return self.tokenizer.decode(tokens)

    def check_block_size(self, block_size: int) -> None:
        """A block plus its next token must fit in the longest shard of each split."""
        for split, shards in self._shards.items():
            longest = max(s.tokens for s in shards)
            if block_size + 1 >= longest:
                raise DataError(
                    f"block size {block_size} is too big for {self.source}: its longest "
                    f"{split} shard has {longest} tokens; lower --block-size or use more text"
                )

    def batches(
        self,
        split: str,
        count: int,
        batch_size: int,
        block_size: int,
        stream: tuple[int, ...],
        shard: tuple[int, int] = (0, 1),
    ) -> tuple[np.ndarray, np.ndarray]:
        """`count` batches of (inputs, next-token targets), each [count, batch, block].

        The same `stream` always gives the same batches. `shard=(i, n)` samples only from
        the i-th of n disjoint contiguous pieces of this dataset's `split` tokens (its
        shard files one after another); no window crosses from one shard file to the
        next. With one shard file this draws exactly what `CharCorpus.batches` draws
        from the same tokens.
        """
        shards = self._shards[_split(split)]
        index, pieces = shard
        piece = sum(s.tokens for s in shards) // pieces
        low, high = index * piece, (index + 1) * piece
        # the window starts each file offers inside the piece, as CharCorpus counts them
        segments: list[tuple[Shard, int, int]] = []  # (file, first start in it, starts)
        offset = 0
        for item in shards:
            first, last = max(low, offset), min(high, offset + item.tokens)
            starts = last - first - block_size - 1
            if starts > 0:
                segments.append((item, first - offset, starts))
            offset += item.tokens
        if not segments:
            raise DataError(
                f"{self.source}: piece {index} of {pieces} of its {_split(split)} tokens has "
                f"no stretch within one shard longer than a block of {block_size}"
            )
        ends = np.cumsum([starts for _, _, starts in segments])
        drawn = np.random.default_rng(list(stream)).integers(0, ends[-1], (count, batch_size))
        windows = np.empty((count, batch_size, block_size + 1), dtype=np.int32)
        which = np.searchsorted(ends, drawn, side="right")
        span = np.arange(block_size + 1)
        for number, (item, first, _) in enumerate(segments):
            chosen = which == number
            if chosen.any():
                before = ends[number - 1] if number else 0
                starts = drawn[chosen] - before + first
                windows[chosen] = self._map(item)[starts[:, None] + span]
        return windows[..., :-1], windows[..., 1:]

    def _map(self, item: Shard) -> np.memmap:
        if item.name not in self._maps:
            path = self.path(item.name)
            try:
                size = path.stat().st_size
            except OSError as error:
                raise DataError(f"shard {item.name}: {path}: {error.strerror or error}") from None
            if size != item.nbytes:
                raise DataError(f"shard {item.name}: {path} has {size} bytes, not {item.nbytes}")
            self._maps[item.name] = np.memmap(
                path, dtype=self.manifest.numpy_dtype(), mode="r", shape=(item.tokens,)
            )
        return self._maps[item.name]

    def verify(self, names: Iterable[str] | None = None) -> None:
        """Check the sha256 of the named shards (default: every shard this dataset
        reads) against the manifest; a mismatch is a DataError naming the shard."""
        every = {s.name: s for s in self.manifest.shards}
        chosen = [*self._shards["train"], *self._shards["validation"]]
        for name in [s.name for s in chosen] if names is None else names:
            if name not in every:
                raise DataError(f"{self.directory} has no shard {name}")
            try:
                digest = sha256_file(self.path(name))
            except OSError as error:
                raise DataError(f"shard {name}: {error.strerror or error}") from None
            if digest != every[name].sha256:
                raise DataError(
                    f"shard {name} ({self.path(name)}) does not match its manifest "
                    f"(sha256 {digest[:12]}…, expected {every[name].sha256[:12]}…)"
                )
        log.debug("shards verified", directory=str(self.directory))


def _split(split: str) -> str:
    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
    return split
