"""The text that `pcp data prepare` reads: finding the input files, streaming their text
in bounded pieces, and cutting it where a tokenizer can encode the pieces separately.

Inputs are files or directories. A file named on the command line is read whatever its
name: as JSON Lines if it ends in `.jsonl` (one object per line with a string `text`
field; blank lines are skipped), else as UTF-8 text. A directory contributes its
`*.txt`, `*.md` and `*.jsonl` files, at any depth, in the order of their sorted paths;
hidden entries and other files are left out (and counted in the log), so a directory
of mixed files needs no cleaning. A text file that is not UTF-8 or holds a NUL byte
(binary data) is refused.

Each text file and each JSONL record is one *document*; documents follow each other in
input order, with a newline between two when the first does not end with one. A single
text file is therefore read exactly as it is.
"""

import codecs
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import structlog

from pcp_core.data.errors import DataError
from pcp_core.data.manifest import InputFile

log = structlog.get_logger(__name__)

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIX = ".jsonl"
READ_BYTES = 1 << 20  # what one read takes from a file
PIECE_CHARACTERS = 1 << 14  # about what one piece handed to a tokenizer holds

Document = Iterator[tuple[str, int]]  # (text, how many bytes of the file it came from)
Documents = Iterator[Document]


@dataclass(frozen=True)
class Source:
    """One input file: where it is, how to read it, its size when it was found."""

    path: Path
    kind: str  # "text" or "jsonl"
    size: int


def find_inputs(paths: Sequence[Path], exclude: Path | None = None) -> list[Source]:
    """The input files named by `paths` (files, or directories' files sorted by path),
    each once, leaving out anything under `exclude` (the output directory)."""
    if not paths:
        raise DataError("no inputs: name text files, JSONL files or directories to read")
    excluded = exclude.resolve() if exclude is not None else None
    found: dict[Path, Source] = {}
    for path in map(Path, paths):
        if path.is_dir():
            files = _walk(path, excluded)
            if not files:
                raise DataError(f"{path} holds no *.txt, *.md or *.jsonl files")
        elif path.exists():
            files = [path]
        else:
            raise DataError(f"input not found: {path}")
        for file in files:
            key = file.resolve()
            if key not in found:
                found[key] = _source(file)
    return list(found.values())


def _walk(directory: Path, excluded: Path | None) -> list[Path]:
    files, skipped = [], 0
    for root, folders, names in os.walk(directory):
        here = Path(root)
        folders[:] = sorted(
            f for f in folders if not f.startswith(".") and (here / f).resolve() != excluded
        )
        for name in sorted(names):
            suffix = Path(name).suffix.lower()
            if name.startswith("."):
                continue
            if suffix in (*TEXT_SUFFIXES, JSONL_SUFFIX):
                files.append(here / name)
            else:
                skipped += 1
    if skipped:
        log.info("files left out (not .txt, .md or .jsonl)", directory=str(directory), n=skipped)
    return sorted(files, key=lambda f: f.relative_to(directory).parts)


def _source(path: Path) -> Source:
    try:
        size = path.stat().st_size
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror or error}") from None
    if not path.is_file():
        raise DataError(f"{path} is not a regular file")
    kind = "jsonl" if path.suffix.lower() == JSONL_SUFFIX else "text"
    return Source(path, kind, size)


class InputReader:
    """Streams the documents of `sources` as text, reporting bytes read to `on_bytes`.

    Each full pass (`texts()` without a limit) also records every input's size, sha256
    and number of documents, as the manifest lists them.
    """

    def __init__(self, sources: Sequence[Source], on_bytes: Callable[[int], None]) -> None:
        self.sources = list(sources)
        self.on_bytes = on_bytes
        self.records: list[InputFile] = []

    def texts(self, limit_bytes: int | None = None) -> Iterator[str]:
        """The text of every document in order, newline-separated, in pieces of at most
        about a megabyte; with `limit_bytes`, it stops once that many bytes were read."""
        records: list[InputFile] = []
        read = 0
        ends_with_newline = True  # nothing before the first document
        for source in self.sources:
            digest, documents, size = hashlib.sha256(), 0, 0
            for document in self._documents(source, digest.update):
                first = True
                for text, raw_bytes in document:
                    size += raw_bytes
                    read += raw_bytes
                    self.on_bytes(raw_bytes)
                    if text:
                        if first:
                            documents += 1
                            if not ends_with_newline:
                                yield "\n"
                        first = False
                        ends_with_newline = text.endswith("\n")
                        yield text
                    if limit_bytes is not None and read >= limit_bytes:
                        return
            records.append(
                InputFile(str(source.path), source.kind, size, digest.hexdigest(), documents)
            )
        if limit_bytes is None:
            self.records = records

    def _documents(self, source: Source, hash_bytes: Callable[[bytes], object]) -> Documents:
        if source.kind == "jsonl":
            yield from _jsonl_documents(source.path, hash_bytes)
        else:
            yield _text_file(source.path, hash_bytes)


def _open(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror or error}") from None


def _text_file(path: Path, hash_bytes: Callable[[bytes], object]) -> Document:
    """(text, bytes it came from) for one UTF-8 text file, read a megabyte at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with _open(path) as handle:
        while True:
            try:
                chunk = handle.read(READ_BYTES)
            except OSError as error:
                raise DataError(f"cannot read {path}: {error.strerror or error}") from None
            hash_bytes(chunk)
            try:
                text = decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{path} is not UTF-8 text (invalid byte near offset {offset + error.start})"
                ) from None
            if "\0" in text:
                raise DataError(f"{path} looks binary: it holds a NUL byte near offset {offset}")
            yield text, len(chunk)
            if not chunk:
                return
            offset += len(chunk)


def _jsonl_documents(path: Path, hash_bytes: Callable[[bytes], object]) -> Documents:
    """One single-piece document per line of a JSON Lines file (blank lines: no text)."""
    with _open(path) as handle:
        for number, line in enumerate(handle, 1):
            hash_bytes(line)
            yield iter([(_jsonl_text(path, number, line), len(line))])


def _jsonl_text(path: Path, number: int, line: bytes) -> str:
    where = f"{path}:{number}"
    if not line.strip():
        return ""
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise DataError(f"{where}: not UTF-8") from None
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: not valid JSON ({error.msg})") from None
    if not isinstance(record, dict) or "text" not in record:
        raise DataError(f'{where}: expected a JSON object with a "text" field')
    if not isinstance(record["text"], str):
        raise DataError(f'{where}: "text" is {type(record["text"]).__name__}, not a string')
    return record["text"]


def pieces(texts: Iterable[str], size: int = PIECE_CHARACTERS) -> Iterator[str]:
    """The concatenated `texts`, re-cut into pieces of about `size` characters.

    A cut falls before a newline (or else a space) that follows a character that is
    not whitespace. There no rule of GPT-2's pre-tokenizer joins the two sides, so a
    byte-level BPE gives the same ids for the pieces one by one as for the whole text.
    Only text with no such place in `size` characters is cut elsewhere.
    """
    rest = ""
    for text in texts:
        buffer, start = rest + text, 0
        while len(buffer) - start >= size:
            cut = _cut(buffer, start, start + size)
            yield buffer[start:cut]
            start = cut
        rest = buffer[start:]
    if rest:
        yield rest


def _cut(text: str, start: int, end: int) -> int:
    """Where to cut `text` between `start` (excluded) and `end`."""
    for separator in ("\n", " "):
        position = text.rfind(separator, start + 1, end)
        while position > start:
            if not text[position - 1].isspace():
                return position
            position = text.rfind(separator, start + 1, position)
    return end
