"""Tokenizers: round trips, their JSON form, and encoding text in pieces."""

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from pcp_core.data import corpus
from pcp_core.data.errors import DataError
from pcp_core.data.text import CharCorpus
from pcp_core.data.text_inputs import pieces
from pcp_core.data.tokenizers import (
    BpeTokenizer,
    ByteTokenizer,
    CharTokenizer,
    Tokenizer,
    from_json,
    load_tokenizer_file,
    train_bpe,
)

TEXT = "hello world, héllo wörld! naïve — 😀\n" * 20


@pytest.fixture(scope="module")
def bpe() -> BpeTokenizer:
    return train_bpe([corpus.generate(50_000)], 300)


def test_chars_give_the_ids_of_char_corpus() -> None:
    tokenizer = CharTokenizer.from_text(TEXT)
    reference = CharCorpus.from_text(TEXT, "test")
    ids = tokenizer.encode(TEXT)
    np.testing.assert_array_equal(ids, np.concatenate([reference.train, reference.validation]))
    assert tokenizer.decode(ids) == TEXT and tokenizer.vocab_size == reference.vocab_size
    assert reference.tokenizer.to_json() == tokenizer.to_json()


def test_chars_refuse_what_they_do_not_know() -> None:
    tokenizer = CharTokenizer.from_text("abc")
    with pytest.raises(DataError, match="character 'z' is not in the vocabulary"):
        tokenizer.encode("abz")
    with pytest.raises(DataError, match="character '😀'"):
        tokenizer.encode("😀")
    with pytest.raises(DataError, match="token id 3 is outside the vocabulary of 3"):
        tokenizer.decode([0, 3])


def test_bytes_round_trip_and_replace_broken_sequences() -> None:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(TEXT)
    assert ids.max() < 256 and len(ids) == len(TEXT.encode("utf-8"))
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.decode(tokenizer.encode("é")[:1]) == "\ufffd"


def test_bpe_round_trip(bpe: BpeTokenizer) -> None:
    assert bpe.name == "bpe" and bpe.vocab_size == 300
    ids = bpe.encode(TEXT)
    assert bpe.decode(ids) == TEXT  # byte-level: any text, even unseen characters
    village = corpus.generate(2_000, seed=5)
    assert len(bpe.encode(village)) < 0.7 * len(village)  # it learnt merges


@pytest.mark.parametrize("kind", ["chars", "bytes", "bpe"])
def test_json_rebuilds_the_same_tokenizer(kind: str, bpe: BpeTokenizer) -> None:
    tokenizer: Tokenizer = {
        "chars": CharTokenizer.from_text(TEXT),
        "bytes": ByteTokenizer(),
        "bpe": bpe,
    }[kind]
    rebuilt = from_json(tokenizer.to_json())
    assert isinstance(rebuilt, Tokenizer) and rebuilt.name == kind
    assert rebuilt.vocab_size == tokenizer.vocab_size
    np.testing.assert_array_equal(rebuilt.encode(TEXT), tokenizer.encode(TEXT))
    assert rebuilt.to_json() == tokenizer.to_json()


def test_bad_json_is_a_data_error() -> None:
    with pytest.raises(DataError, match="not valid JSON"):
        from_json("{")
    with pytest.raises(DataError, match="unknown tokenizer in JSON: kind 'words'"):
        from_json('{"kind": "words"}')
    with pytest.raises(DataError, match="not a Hugging Face tokenizer"):
        from_json('{"kind": "bpe", "tokenizer": {"model": 3}}')


def test_tokenizer_files(tmp_path: Path, bpe: BpeTokenizer) -> None:
    hugging_face = tmp_path / "tokenizer.json"
    hugging_face.write_text(json.dumps(json.loads(bpe.to_json())["tokenizer"]))
    loaded = load_tokenizer_file(hugging_face)
    np.testing.assert_array_equal(loaded.encode(TEXT), bpe.encode(TEXT))
    ours = tmp_path / "chars.json"
    ours.write_text(CharTokenizer.from_text("ab").to_json())
    assert load_tokenizer_file(ours).vocab_size == 2
    with pytest.raises(DataError, match="tokenizer file not found"):
        load_tokenizer_file(tmp_path / "missing.json")


def test_pieces_keep_the_text_and_the_bpe_ids(bpe: BpeTokenizer) -> None:
    """Cut where `pieces` cuts, a byte-level BPE gives the ids of the whole text."""
    rng = random.Random(0)
    alphabet = [*"ab cd\n\t.,'1é😀", "  ", "\r\n", "'ll", " \n", "\u3000", "\xa0", "\n\n"]
    compared = 0
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300)))
        parts = list(pieces([text[i : i + 7] for i in range(0, len(text), 7)], rng.randint(8, 40)))
        assert "".join(parts) == text and all(parts)
        pairs = itertools.pairwise(parts)
        cuts_are_safe = all(b[0] in " \n" and not a[-1].isspace() for a, b in pairs)
        if cuts_are_safe:  # text with no such place in a piece's length is cut anyway
            compared += 1
            joined = np.concatenate([bpe.encode(p) for p in parts])
            np.testing.assert_array_equal(joined, bpe.encode(text))
    assert compared > 100
