"""Tokenizers: text to integer ids and back, and a JSON form that rebuilds them.

Three kinds, one interface (`Tokenizer`):

- `chars`: one id per distinct character, in sorted order (what `CharCorpus` uses);
- `bytes`: the UTF-8 bytes, 256 ids, any text;
- `bpe`: a Hugging Face `tokenizers` model, a byte-level BPE when PCP trains it
  (`train_bpe`) or whatever a user's `tokenizer.json` holds (`load_tokenizer_file`).

`to_json()` goes into dataset manifests and checkpoints; `from_json()` turns it back
into the same tokenizer, so a checkpoint can be sampled without its training data.
The `tokenizers` package is imported only when a `bpe` tokenizer is built.
"""

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import structlog

from pcp_core.data.errors import DataError

log = structlog.get_logger(__name__)

# The largest vocabulary a token shard can hold (its ids are uint32).
MAX_VOCAB = 2**32
Ids = Sequence[int] | np.ndarray


@runtime_checkable
class Tokenizer(Protocol):
    """What every tokenizer offers; ids are non-negative and below `vocab_size`."""

    name: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Ids) -> str: ...

    def to_json(self) -> str: ...


def _check_ids(ids: Ids, vocab_size: int) -> np.ndarray:
    array = np.asarray(ids, dtype=np.int64).reshape(-1)
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        bad = array[(array < 0) | (array >= vocab_size)][0]
        raise DataError(f"token id {bad} is outside the vocabulary of {vocab_size}")
    return array


class CharTokenizer:
    """One id per character of `vocabulary` (sorted, distinct): the same ids as
    `CharCorpus` gives the same text."""

    name = "chars"

    def __init__(self, vocabulary: str) -> None:
        if not vocabulary or list(vocabulary) != sorted(set(vocabulary)):
            raise DataError("a chars vocabulary must be distinct characters in sorted order")
        self.vocabulary = vocabulary
        codes = np.frombuffer(vocabulary.encode("utf-32-le"), dtype=np.uint32)
        self._lookup = np.full(int(codes.max()) + 1, -1, dtype=np.int64)
        self._lookup[codes] = np.arange(len(vocabulary))

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    def encode(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        ids = self._lookup[np.minimum(codes, len(self._lookup) - 1)]
        unknown = (codes >= len(self._lookup)) | (ids < 0)
        if unknown.any():
            character = chr(int(codes[unknown][0]))
            raise DataError(
                f"character {character!r} is not in the vocabulary ({self.vocab_size} characters)"
            )
        return ids.astype(np.uint32)

    def decode(self, ids: Ids) -> str:
        return "".join(self.vocabulary[i] for i in _check_ids(ids, self.vocab_size))

    def to_json(self) -> str:
        return json.dumps({"kind": self.name, "vocabulary": self.vocabulary})


class ByteTokenizer:
    """The UTF-8 bytes of the text: 256 ids, nothing to learn, nothing unknown."""

    name = "bytes"
    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint32)

    def decode(self, ids: Ids) -> str:
        raw = _check_ids(ids, self.vocab_size).astype(np.uint8).tobytes()
        return raw.decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"kind": self.name})


class BpeTokenizer:
    """A Hugging Face `tokenizers` model, used without special tokens added around the text."""

    name = "bpe"

    def __init__(self, model: Any) -> None:
        self._model = model
        vocabulary = model.get_vocab(with_added_tokens=True)
        # ids may leave gaps (added tokens): the model must have room for the largest
        self._vocab_size = max(vocabulary.values(), default=-1) + 1
        if self._vocab_size < 2:
            raise DataError("the tokenizer has an empty vocabulary")

    @classmethod
    def from_hugging_face_json(cls, text: str, source: str = "tokenizer") -> "BpeTokenizer":
        from tokenizers import Tokenizer as HuggingFaceTokenizer

        try:
            return cls(HuggingFaceTokenizer.from_str(text))
        except Exception as error:  # the Rust side raises plain Exceptions
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DataError(f"{source} is not a Hugging Face tokenizer: {message}") from None

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._model.encode(text, add_special_tokens=False).ids, np.uint32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Several texts at once, in parallel threads (much faster than one by one)."""
        encodings = self._model.encode_batch_fast(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.uint32) for e in encodings]

    def decode(self, ids: Ids) -> str:
        checked = _check_ids(ids, self.vocab_size)
        return self._model.decode(checked.tolist(), skip_special_tokens=False)

    def to_json(self) -> str:
        return json.dumps({"kind": self.name, "tokenizer": json.loads(self._model.to_str())})


def encode_batch(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """`tokenizer.encode` of each text, batched where the tokenizer can do that faster."""
    batched = getattr(tokenizer, "encode_batch", None)
    return batched(texts) if batched else [tokenizer.encode(t) for t in texts]


def from_json(text: str) -> Tokenizer:
    """The tokenizer whose `to_json()` gave `text`."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"tokenizer JSON is not valid JSON: {error}") from None
    kind = spec.get("kind") if isinstance(spec, dict) else None
    if kind == "chars" and isinstance(spec.get("vocabulary"), str):
        return CharTokenizer(spec["vocabulary"])
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "bpe" and isinstance(spec.get("tokenizer"), dict):
        return BpeTokenizer.from_hugging_face_json(json.dumps(spec["tokenizer"]))
    raise DataError(f"unknown tokenizer in JSON: kind {kind!r} (known: chars, bytes, bpe)")


def load_tokenizer_file(path: Path) -> Tokenizer:
    """A tokenizer file: a Hugging Face `tokenizer.json`, or the JSON of `to_json()`; or
    a Hugging Face model folder's tokenizer (`load_tokenizer_dir`)."""
    if Path(path).is_dir():
        return load_tokenizer_dir(Path(path))
    try:
        text = Path(path).read_text(encoding="utf-8")
        spec = json.loads(text)
    except FileNotFoundError:
        raise DataError(f"tokenizer file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"cannot read the tokenizer {path}: {error}") from None
    if isinstance(spec, dict) and "kind" in spec:
        return from_json(text)
    return BpeTokenizer.from_hugging_face_json(text, source=str(path))


def train_bpe(texts: Iterable[str], vocab_size: int) -> BpeTokenizer:
    """A byte-level BPE (GPT-2's pre-tokenizer, no prefix space, no special tokens)
    learnt from `texts`; it may end up smaller than `vocab_size` if the text has
    fewer merges to offer."""
    from tokenizers import Tokenizer as HuggingFaceTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    model = HuggingFaceTokenizer(models.BPE())
    # no prefix space: encoding a text in pieces then gives the same ids as encoding it
    # whole, when the pieces are cut before whitespace (see pcp_core.data.text_inputs)
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(texts, trainer=trainer)
    tokenizer = BpeTokenizer(model)
    if tokenizer.vocab_size < vocab_size:
        log.warning("bpe vocabulary smaller than asked", asked=vocab_size, got=tokenizer.vocab_size)
    return tokenizer


def load_tokenizer_dir(directory: Path) -> Tokenizer:
    """A Hugging Face model folder's tokenizer: its `tokenizer.json`, or GPT-2's
    `vocab.json` and `merges.txt` (a byte-level BPE, no prefix space)."""
    if (directory / "tokenizer.json").is_file():
        return load_tokenizer_file(directory / "tokenizer.json")
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    if not (vocab.is_file() and merges.is_file()):
        raise DataError(f"{directory} holds no tokenizer.json, nor vocab.json and merges.txt")
    from tokenizers import Tokenizer as HuggingFaceTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    try:
        model = HuggingFaceTokenizer(models.BPE.from_file(str(vocab), str(merges)))
    except Exception as error:  # the Rust side raises plain Exceptions
        raise DataError(f"{directory}: unreadable vocab.json or merges.txt: {error}") from None
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    return BpeTokenizer(model)


def hugging_face_tokenizer(tokenizer: Tokenizer) -> Any:
    """`tokenizer` as a Hugging Face `tokenizers` model giving the same ids: a bpe one as
    it is; chars and bytes as a BPE without merges over their characters, or bytes
    (GPT-2's byte-to-character table)."""
    from tokenizers import Tokenizer as HuggingFaceTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    if isinstance(tokenizer, BpeTokenizer):
        return tokenizer._model
    if isinstance(tokenizer, CharTokenizer):
        vocabulary = {character: i for i, character in enumerate(tokenizer.vocabulary)}
        model = HuggingFaceTokenizer(models.BPE(vocabulary, []))
        model.decoder = decoders.Fuse()
        return model
    if isinstance(tokenizer, ByteTokenizer):
        table = _byte_characters()
        model = HuggingFaceTokenizer(models.BPE({table[b]: b for b in range(256)}, []))
        model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        model.decoder = decoders.ByteLevel()
        return model
    raise DataError(f"no Hugging Face form of a {tokenizer.name} tokenizer")


def write_tokenizer_dir(tokenizer: Tokenizer, out: Path, max_length: int) -> list[Path]:
    """`tokenizer.json` and `tokenizer_config.json` in `out`, for `AutoTokenizer`."""
    written = [out / "tokenizer.json", out / "tokenizer_config.json"]
    hugging_face_tokenizer(tokenizer).save(str(written[0]))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length}
    written[1].write_text(json.dumps(settings, indent=2) + "\n")
    return written


def _byte_characters() -> dict[int, str]:
    """GPT-2's printable character for each byte (the ByteLevel pre-tokenizer's table)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table
