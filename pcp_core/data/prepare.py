"""`pcp data prepare`: turn text into token shards and a manifest, in bounded memory.

The inputs are streamed (`pcp_core.data.text_inputs`), encoded piece by piece, split into
train and validation on the fly, and written to shards as they fill; nothing holds more
than a few megabytes of text or tokens at once, whatever the corpus size.

- Tokenizer: `chars` needs a first pass to collect the character set; `bpe` is trained
  on a first pass over the first `bpe_sample_bytes` of the input (default 100 MB). The
  training's memory grows with the distinct words of its sample, not with the corpus:
  the whole run peaked at 0.44 GB in benchmarks/prepare_memory.py, and at 0.7 GB on
  100 MB of made-up words with an even longer tail (0.96 GB with a 200 MB sample).
  `bytes` and a tokenizer file need no first pass.
- Validation: of every span of `SPAN_TOKENS` (2^20) tokens of the stream, the last
  `validation_fraction` goes to validation, the rest to train; the final, shorter span
  is split the same way. A corpus shorter than a span is split like `CharCorpus` splits.
- Crash safety: shards are written as `NAME.partial` and renamed when complete; the
  manifest is written last, atomically. An earlier dataset in the directory (only with
  `overwrite`) loses its manifest before any of its shards is touched.
"""

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from pcp_core.data import manifest as manifests
from pcp_core.data.errors import DataError
from pcp_core.data.manifest import InputFile, Manifest
from pcp_core.data.shard_writer import ShardWriter, SpanSplitter
from pcp_core.data.text_inputs import InputReader, Source, find_inputs, pieces
from pcp_core.data.tokenizers import (
    MAX_VOCAB,
    ByteTokenizer,
    CharTokenizer,
    Tokenizer,
    encode_batch,
    load_tokenizer_file,
    train_bpe,
)

log = structlog.get_logger(__name__)

SPAN_TOKENS = 1 << 20
MIN_SPLIT_TOKENS = 16  # the fewest tokens either split may have
MIN_SHARD_TOKENS = 256
DEFAULT_BPE_VOCAB = 8192
BATCH_CHARACTERS = 1 << 21  # text encoded in one call (in parallel, for bpe)


@dataclass(frozen=True)
class PrepareOptions:
    """What `pcp data prepare` was asked to do."""

    inputs: list[Path]
    output: Path
    tokenizer: str = "chars"  # chars, bytes, bpe, or the path of a tokenizer JSON file
    vocab_size: int | None = None  # bpe only (default DEFAULT_BPE_VOCAB)
    validation_fraction: float = 0.1
    shard_tokens: int = 100_000_000
    bpe_sample_bytes: int = 100_000_000
    overwrite: bool = False


class ByteProgress(Protocol):
    """Where `prepare` reports its passes over the input, in bytes."""

    def start(self, description: str, total: int) -> None: ...

    def advance(self, amount: int) -> None: ...


class NoProgress:
    def start(self, description: str, total: int) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass


def prepare(options: PrepareOptions, progress: ByteProgress | None = None) -> Manifest:
    """Read the inputs, write the shards and the manifest into `options.output`."""
    progress = progress or NoProgress()
    _check_options(options)
    sources = find_inputs(options.inputs, exclude=options.output)
    total_bytes = sum(s.size for s in sources)
    if total_bytes == 0:
        raise DataError(f"nothing to read: the {len(sources)} input file(s) are empty")
    _check_output(options.output, options.overwrite)
    started = time.perf_counter()
    reader = InputReader(sources, progress.advance)
    tokenizer, first_pass = _build_tokenizer(options, reader, progress, total_bytes)
    if tokenizer.vocab_size > MAX_VOCAB:
        raise DataError(
            f"the tokenizer has {tokenizer.vocab_size:,} tokens; a shard holds at most "
            f"{MAX_VOCAB:,} (uint32)"
        )
    created = not options.output.exists()
    try:
        _clear_output(options.output)
        writers, splitter = _write_shards(options, tokenizer, reader, progress, total_bytes)
        _check_inputs_unchanged(first_pass, reader.records)
        result = Manifest(
            tokenizer=tokenizer.to_json(),
            vocab_size=tokenizer.vocab_size,
            dtype=manifests.token_dtype(tokenizer.vocab_size),
            validation_fraction=options.validation_fraction,
            span_tokens=SPAN_TOKENS,
            shards=writers["train"].shards + writers["validation"].shards,
            inputs=reader.records,
            train_unigram_entropy=splitter.train_entropy(),
            totals={
                "tokens": splitter.tokens["train"] + splitter.tokens["validation"],
                "train_tokens": splitter.tokens["train"],
                "validation_tokens": splitter.tokens["validation"],
                "documents": sum(r.documents for r in reader.records),
                "bytes": sum(r.bytes for r in reader.records),
            },
        )
        manifests.write_manifest(options.output, result)
    except OSError as error:  # reading errors are DataErrors already: this is the output
        raise DataError(f"cannot write {options.output}: {error.strerror or error}") from None
    except BaseException:  # e.g. too little text: leave no empty directory behind
        if created and options.output.is_dir() and not any(options.output.iterdir()):
            options.output.rmdir()
        raise
    log.debug(
        "prepared",
        output=str(options.output),
        tokenizer=tokenizer.name,
        vocab_size=tokenizer.vocab_size,
        tokens=result.totals["tokens"],
        shards=len(result.shards),
        seconds=round(time.perf_counter() - started, 1),
    )
    return result


def _write_shards(
    options: PrepareOptions,
    tokenizer: Tokenizer,
    reader: InputReader,
    progress: ByteProgress,
    total_bytes: int,
) -> tuple[dict[str, "ShardWriter"], "SpanSplitter"]:
    """The encoding pass: every complete shard written, or (after any error) none."""
    dtype = manifests.token_dtype(tokenizer.vocab_size)
    writers = {
        split: ShardWriter(options.output, split, dtype, options.shard_tokens)
        for split in manifests.SPLITS
    }
    splitter = SpanSplitter(options.validation_fraction, SPAN_TOKENS, writers)
    try:
        progress.start("encoding", total_bytes)
        for batch in _batches(pieces(reader.texts())):
            for tokens in encode_batch(tokenizer, batch):
                splitter.add(tokens)
        splitter.finish()
        for writer in writers.values():
            writer.close()
        _check_split_sizes(splitter, reader.sources)
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    return writers, splitter


def _check_options(options: PrepareOptions) -> None:
    if not 0 < options.validation_fraction < 1:
        raise DataError(
            f"--validation-fraction must be between 0 and 1, got {options.validation_fraction}"
        )
    if options.shard_tokens < MIN_SHARD_TOKENS:
        raise DataError(f"--shard-tokens must be at least {MIN_SHARD_TOKENS}")
    if options.bpe_sample_bytes <= 0:
        raise DataError("--bpe-sample-bytes must be positive")
    if options.vocab_size is not None and options.tokenizer != "bpe":
        raise DataError(
            f"--vocab-size is for --tokenizer bpe; {options.tokenizer} has a vocabulary of its own"
        )
    vocab_size = options.vocab_size or DEFAULT_BPE_VOCAB
    if options.tokenizer == "bpe" and not 257 <= vocab_size <= MAX_VOCAB:
        raise DataError(
            f"--vocab-size must be at least 257 (the 256 bytes and one merge) and at most "
            f"{MAX_VOCAB:,}, got {vocab_size}"
        )


def _check_output(output: Path, overwrite: bool) -> None:
    """Refuse an output that is a file, holds files of its own, or (without
    `overwrite`) a dataset."""
    if output.exists() and not output.is_dir():
        raise DataError(f"output {output} exists and is not a directory")
    if not output.is_dir():
        return
    foreign = sorted(p.name for p in output.iterdir() if not _ours(p))
    if foreign:
        raise DataError(
            f"output {output} holds files that are not a prepared dataset ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}); choose an empty or new directory"
        )
    if (output / manifests.MANIFEST_NAME).exists() and not overwrite:
        raise DataError(
            f"output {output} already holds a prepared dataset ({_describe(output)}); "
            "pass --overwrite to replace it, or choose another -o"
        )


def _ours(path: Path) -> bool:
    name = path.name.removesuffix(".partial")
    return path.is_file() and (
        manifests.SHARD_NAME.fullmatch(name) is not None
        or name in (manifests.MANIFEST_NAME, manifests.MANIFEST_NAME + ".tmp")
    )


def _describe(output: Path) -> str:
    try:
        found = manifests.read_manifest(output)
    except DataError:
        return "an unreadable or incomplete one"
    inputs = ", ".join(Path(i.path).name for i in found.inputs[:2])
    kind = json.loads(found.tokenizer).get("kind")
    return f"{found.totals.get('tokens', 0):,} {kind} tokens from {inputs}"


def _clear_output(output: Path) -> None:
    """Make `output` an empty directory: the manifest goes first, so no crash from here
    on leaves a manifest naming a shard that changed."""
    output.mkdir(parents=True, exist_ok=True)
    (output / manifests.MANIFEST_NAME).unlink(missing_ok=True)
    for path in output.iterdir():
        path.unlink()


def _build_tokenizer(
    options: PrepareOptions, reader: InputReader, progress: ByteProgress, total_bytes: int
) -> tuple[Tokenizer, list[InputFile] | None]:
    """The tokenizer asked for, with a first pass over the input where it must learn;
    and what a full first pass saw of the inputs (to check they did not change)."""
    name = options.tokenizer
    if name == "bytes":
        return ByteTokenizer(), None
    if name == "chars":
        progress.start("collecting characters", total_bytes)
        characters: set[str] = set()
        for text in reader.texts():
            characters.update(text)
        if not characters:
            raise DataError("nothing to read: the inputs hold no text")
        return CharTokenizer("".join(sorted(characters))), reader.records
    if name == "bpe":
        sample = min(options.bpe_sample_bytes, total_bytes)
        progress.start("training the bpe tokenizer", sample)
        texts = pieces(reader.texts(limit_bytes=options.bpe_sample_bytes))
        return train_bpe(texts, options.vocab_size or DEFAULT_BPE_VOCAB), None
    if name.endswith(".json") or Path(name).is_file() or Path(name).is_dir():
        return load_tokenizer_file(Path(name)), None
    raise DataError(
        f"unknown --tokenizer {name!r}: chars, bytes, bpe, a tokenizer .json file or a "
        "Hugging Face model folder"
    )


def _batches(texts: Iterator[str]) -> Iterator[list[str]]:
    """Pieces of text grouped into batches of about BATCH_CHARACTERS."""
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= BATCH_CHARACTERS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _check_inputs_unchanged(first_pass: list[InputFile] | None, now: list[InputFile]) -> None:
    if first_pass is None:
        return
    for before, after in zip(first_pass, now, strict=True):
        if before.sha256 != after.sha256:
            raise DataError(f"{after.path} changed while it was being read; run again")


def _check_split_sizes(splitter: "SpanSplitter", sources: list[Source]) -> None:
    train, validation = splitter.tokens["train"], splitter.tokens["validation"]
    if train + validation == 0:
        raise DataError("nothing to read: the inputs hold no text")
    if min(train, validation) < MIN_SPLIT_TOKENS:
        where = sources[0].path if len(sources) == 1 else f"the {len(sources)} inputs"
        raise DataError(
            f"too little text in {where}: {train + validation} tokens leave {validation} for "
            f"validation and {train} for training; each needs at least {MIN_SPLIT_TOKENS} "
            "(use more text or change --validation-fraction)"
        )
