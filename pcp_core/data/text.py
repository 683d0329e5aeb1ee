"""Character-level text data: tokenizer, train/validation split, deterministic batches.

The `chars` dataset source also opens a directory written by `pcp data prepare` (a
`manifest.json` and token shards) as a `pcp_core.data.shards.PreparedDataset`, which offers
the same interface (`Corpus`) without loading its tokens.
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pcp_core.data import corpus
from pcp_core.data.errors import DataError
from pcp_core.data.manifest import MANIFEST_NAME
from pcp_core.data.shards import PreparedDataset
from pcp_core.data.tokenizers import CharTokenizer


class Corpus(Protocol):
    """What training reads from a dataset: `CharCorpus` and `PreparedDataset` both offer it."""

    source: str

    @property
    def vocab_size(self) -> int: ...

    @property
    def tokenizer(self) -> Any: ...

    def unigram_entropy(self) -> float: ...

    def decode(self, tokens: np.ndarray) -> str: ...

    def check_block_size(self, block_size: int) -> None: ...

    def batches(
        self,
        split: str,
        count: int,
        batch_size: int,
        block_size: int,
        stream: tuple[int, ...],
        shard: tuple[int, int] = (0, 1),
    ) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class DatasetSource:
    """A registered way to turn an optional path into a corpus (`CharCorpus` or any
    other `Corpus`)."""

    name: str
    load: Callable[[Path | None], Corpus]
    description: str = ""


@dataclass
class CharCorpus:
    """A text corpus tokenized by character, split 90/10 into train and validation."""

    vocabulary: str
    train: np.ndarray
    validation: np.ndarray
    source: str

    @classmethod
    def from_text(cls, text: str, source: str, validation_fraction: float = 0.1) -> "CharCorpus":
        if len(text) < 64:
            raise DataError(f"{source}: only {len(text)} characters; need at least 64")
        vocabulary = "".join(sorted(set(text)))
        if len(vocabulary) > 256:
            raise DataError(f"{source}: {len(vocabulary)} distinct characters; at most 256")
        lookup = np.zeros(max(map(ord, vocabulary)) + 1, dtype=np.int32)
        lookup[[ord(c) for c in vocabulary]] = np.arange(len(vocabulary), dtype=np.int32)
        tokens = lookup[np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)]
        split = int(len(tokens) * (1 - validation_fraction))
        return cls(vocabulary, tokens[:split], tokens[split:], source)

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    @property
    def tokenizer(self) -> CharTokenizer:
        """The chars tokenizer over this vocabulary (its `to_json()` rebuilds it)."""
        return CharTokenizer(self.vocabulary)

    def unigram_entropy(self) -> float:
        """Entropy in nats of the training characters: the loss of a model with no context."""
        counts = np.array(list(Counter(self.train.tolist()).values()), dtype=np.float64)
        p = counts / counts.sum()
        return float(-(p * np.log(p)).sum())

    def decode(self, tokens: np.ndarray) -> str:
        return "".join(self.vocabulary[t] for t in tokens)

    def check_block_size(self, block_size: int) -> None:
        shortest = min(len(self.train), len(self.validation))
        if block_size + 1 > shortest:
            raise DataError(
                f"block size {block_size} is too big for {self.source}: its smallest split "
                f"has {shortest} characters; lower --block-size or use more text"
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
        """`count` batches of (inputs, next-char targets), each [count, batch, block].

        The same `stream` (seed, call index, ...) always gives the same batches, and
        `shard=(i, n)` samples only from the i-th of n disjoint contiguous pieces.
        """
        tokens = self.train if split == "train" else self.validation
        index, shards = shard
        piece = len(tokens) // shards
        low, high = index * piece, (index + 1) * piece - block_size - 1
        if high <= low:
            raise DataError(f"{self.source}: shard of {piece} characters is shorter than a block")
        starts = np.random.default_rng(list(stream)).integers(low, high, size=(count, batch_size))
        offsets = starts[..., None] + np.arange(block_size + 1)
        windows = tokens[offsets]
        return windows[..., :-1].astype(np.int32), windows[..., 1:].astype(np.int32)


def load_text_file(path: Path | None) -> Corpus:
    """A text file given by `--data` (a `CharCorpus`), a directory written by `pcp data
    prepare` (a `PreparedDataset`), or the generated default corpus when there is none."""
    if path is None:
        return CharCorpus.from_text(corpus.generate(), "the built-in village corpus")
    path = Path(path)
    if path.is_dir():
        if not (path / MANIFEST_NAME).is_file():
            if any(path.iterdir()):  # its files are the inputs: the dataset goes elsewhere
                prepared = path.with_name(f"{path.name}-prepared")
                prepare = f"`pcp data prepare {path} -o {prepared}`, then --data {prepared}"
            else:
                prepare = f"`pcp data prepare INPUT... -o {path}`"
            raise DataError(
                f"{path} is a directory without {MANIFEST_NAME}, not a prepared dataset: "
                f"prepare one with {prepare}, or pass a text file"
            )
        return PreparedDataset.open(path)
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{path} is not UTF-8 text: {error}") from None
    return CharCorpus.from_text(text, str(path))


CHAR_TEXT = DatasetSource(
    name="chars",
    load=load_text_file,
    description="character tokenizer over a UTF-8 text file (default: generated corpus), "
    "or a directory of token shards written by `pcp data prepare`",
)
