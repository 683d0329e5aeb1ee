"""The manifest of a prepared token dataset: what `pcp data prepare` writes last and
`PreparedDataset` reads first.

A dataset directory holds flat little-endian token shards (`train-00000.bin`,
`val-00000.bin`, ...; uint16 when the vocabulary fits, else uint32) and one
`manifest.json` that lists them with their token counts and sha256, the tokenizer
(its `to_json()`, as an object), and where the data came from. The manifest is
written through a temporary file and a rename, after every shard is complete, so
a manifest never names a half-written shard.
"""

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pcp_core.data.errors import DataError

MANIFEST_NAME = "manifest.json"
FORMAT = "pcp-token-shards"
VERSION = 1
SPLITS = {"train": "train", "validation": "val"}  # split -> shard file prefix
SHARD_NAME = re.compile(r"(train|val)-\d{5}\.bin")
SHA256 = re.compile(r"[0-9a-f]{64}")  # a shard's hash names its file in a worker's cache


def shard_name(split: str, index: int) -> str:
    return f"{SPLITS[split]}-{index:05d}.bin"


def token_dtype(vocab_size: int) -> str:
    """The smallest unsigned dtype that holds every id of the vocabulary."""
    return "uint16" if vocab_size <= 2**16 else "uint32"


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in pieces."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@dataclass(frozen=True)
class Shard:
    name: str
    split: str  # "train" or "validation"
    tokens: int
    nbytes: int  # the file's size: tokens x the dtype's size
    sha256: str


@dataclass(frozen=True)
class InputFile:
    path: str
    kind: str  # "text" or "jsonl"
    bytes: int
    sha256: str
    documents: int


@dataclass(frozen=True)
class Manifest:
    """Everything `manifest.json` says; `tokenizer` is the tokenizer's `to_json()` text."""

    tokenizer: str
    vocab_size: int
    dtype: str
    validation_fraction: float
    span_tokens: int
    shards: list[Shard]
    inputs: list[InputFile]
    train_unigram_entropy: float
    totals: dict[str, int] = field(default_factory=dict)

    def shards_of(self, split: str) -> list[Shard]:
        return [s for s in self.shards if s.split == split]

    def numpy_dtype(self) -> np.dtype:
        return np.dtype(self.dtype).newbyteorder("<")

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "dtype": self.dtype,
            "byte_order": "little",
            "vocab_size": self.vocab_size,
            "tokenizer": json.loads(self.tokenizer),
            "validation": {
                "fraction": self.validation_fraction,
                "span_tokens": self.span_tokens,
                "rule": "the last `fraction` of every span of `span_tokens` tokens, and of "
                "the final shorter span, is validation",
                "shards": [s.name for s in self.shards_of("validation")],
            },
            "totals": self.totals,
            "train_unigram_entropy": self.train_unigram_entropy,
            "shards": [asdict(s) for s in self.shards],
            "inputs": [asdict(i) for i in self.inputs],
        }


def write_manifest(directory: Path, manifest: Manifest) -> Path:
    """Write DIRECTORY/manifest.json atomically: a temporary file, flushed, then renamed."""
    path = directory / MANIFEST_NAME
    temporary = directory / (MANIFEST_NAME + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(manifest.to_dict(), handle, indent=1, ensure_ascii=False)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _sync_directory(directory)
    return path


def _sync_directory(directory: Path) -> None:
    """Make the renames in `directory` durable (where the platform allows it)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def read_manifest(directory: Path) -> Manifest:
    """DIRECTORY/manifest.json, checked: known format, consistent fields, every shard
    present with the size its token count says (hashes: `PreparedDataset.verify`)."""
    path = Path(directory) / MANIFEST_NAME
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(
            f"{directory} has no {MANIFEST_NAME}: run `pcp data prepare INPUT... -o {directory}`"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{path} cannot be read: {error}") from None
    manifest = parse_manifest(raw, str(path))
    _check_files(manifest, Path(directory))
    return manifest


def parse_manifest(raw: Any, path: str = MANIFEST_NAME) -> Manifest:
    """A manifest from its JSON object (`Manifest.to_dict()`), checked for consistency
    but not against any file; `path` names it in errors."""
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise DataError(f"{path} is not a PCP token dataset manifest")
    if raw.get("version") != VERSION:
        raise DataError(
            f"{path} has format version {raw.get('version')}; this PCP reads {VERSION}: "
            "prepare the data again with this version"
        )
    try:
        manifest = Manifest(
            tokenizer=json.dumps(raw["tokenizer"]),
            vocab_size=int(raw["vocab_size"]),
            dtype=str(raw["dtype"]),
            validation_fraction=float(raw["validation"]["fraction"]),
            span_tokens=int(raw["validation"]["span_tokens"]),
            shards=[Shard(**s) for s in raw["shards"]],
            inputs=[InputFile(**i) for i in raw["inputs"]],
            train_unigram_entropy=float(raw["train_unigram_entropy"]),
            totals=dict(raw.get("totals", {})),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise DataError(f"{path} is malformed ({type(error).__name__}: {error})") from None
    fits = manifest.dtype == "uint32" or token_dtype(manifest.vocab_size) == "uint16"
    if manifest.dtype not in ("uint16", "uint32") or not fits:
        raise DataError(
            f"{path}: dtype {manifest.dtype} cannot hold a vocabulary of {manifest.vocab_size}"
        )
    itemsize = np.dtype(manifest.dtype).itemsize
    for shard in manifest.shards:
        if not SHARD_NAME.fullmatch(shard.name) or shard.split not in SPLITS:
            raise DataError(f"{path}: bad shard entry {shard.name!r} ({shard.split})")
        if not SHA256.fullmatch(str(shard.sha256)):
            raise DataError(f"{path}: shard {shard.name} has no valid sha256")
        if shard.tokens <= 0 or shard.nbytes != shard.tokens * itemsize:
            raise DataError(f"{path}: shard {shard.name} has {shard.nbytes} bytes for its tokens")
    for split in SPLITS:
        if not manifest.shards_of(split):
            raise DataError(f"{path}: the manifest lists no {split} shard")
    return manifest


def _check_files(manifest: Manifest, directory: Path) -> None:
    """Every shard of the manifest is in `directory`, with its size."""
    for shard in manifest.shards:
        try:
            size = (directory / shard.name).stat().st_size
        except FileNotFoundError:
            raise DataError(
                f"{directory}: shard {shard.name} is missing; prepare the data again"
            ) from None
        if size != shard.nbytes:
            raise DataError(
                f"{directory}: shard {shard.name} has {size} bytes, the manifest says "
                f"{shard.nbytes}; prepare the data again"
            )
