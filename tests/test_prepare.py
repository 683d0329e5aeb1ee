"""`pcp data prepare` and `PreparedDataset`: shards, manifest, split, batches, errors."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pcp_core.data import corpus, prepare
from pcp_core.data.errors import DataError
from pcp_core.data.manifest import parse_manifest, read_manifest, sha256_file
from pcp_core.data.prepare import PrepareOptions
from pcp_core.data.shards import PreparedDataset
from pcp_core.data.text import CharCorpus, load_text_file
from pcp_core.data.tokenizers import ByteTokenizer, from_json
from tests.conftest import run_pcp

VILLAGE = corpus.generate(60_000)


def make(tmp_path: Path, *inputs: Path, **options: Any) -> PreparedDataset:
    output = options.pop("output", tmp_path / "data")
    prepare.prepare(PrepareOptions(inputs=list(inputs), output=output, **options))
    return PreparedDataset.open(output)


def text_file(folder: Path, text: str = VILLAGE, name: str = "corpus.txt") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def read_split(dataset: PreparedDataset, split: str) -> np.ndarray:
    dtype = dataset.manifest.numpy_dtype()
    maps = [np.memmap(dataset.path(s.name), dtype=dtype, mode="r") for s in dataset.shards(split)]
    return np.concatenate(maps)


def test_chars_shards_are_char_corpus_tokens(tmp_path: Path) -> None:
    dataset = make(tmp_path, text_file(tmp_path))
    reference = CharCorpus.from_text(VILLAGE, "reference")
    np.testing.assert_array_equal(read_split(dataset, "train"), reference.train)
    np.testing.assert_array_equal(read_split(dataset, "validation"), reference.validation)
    assert dataset.vocab_size == reference.vocab_size and dataset.manifest.dtype == "uint16"
    assert dataset.tokenizer.to_json() == reference.tokenizer.to_json()
    assert dataset.unigram_entropy() == pytest.approx(reference.unigram_entropy())
    for stream, shard in [((3, 1), (0, 1)), ((4,), (1, 2))]:
        ours = dataset.batches("train", 2, 4, 16, stream, shard)
        theirs = reference.batches("train", 2, 4, 16, stream, shard)
        np.testing.assert_array_equal(ours[0], theirs[0])
        np.testing.assert_array_equal(ours[1], theirs[1])


def test_manifest_lists_hashes_sizes_and_inputs(tmp_path: Path) -> None:
    source = text_file(tmp_path)
    make(tmp_path, source, tokenizer="bytes")
    raw = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert raw["format"] == "pcp-token-shards" and raw["version"] == 1
    assert raw["dtype"] == "uint16" and raw["vocab_size"] == 256
    assert from_json(json.dumps(raw["tokenizer"])).name == "bytes"
    assert raw["validation"]["fraction"] == 0.1 and raw["validation"]["shards"] == ["val-00000.bin"]
    for shard in raw["shards"]:
        path = tmp_path / "data" / shard["name"]
        assert sha256_file(path) == shard["sha256"]
        assert path.stat().st_size == shard["nbytes"] == 2 * shard["tokens"]
    assert raw["totals"]["tokens"] == len(VILLAGE.encode()) == raw["inputs"][0]["bytes"]
    assert raw["inputs"][0]["sha256"] == sha256_file(source)
    assert not list((tmp_path / "data").glob("*.partial")) and len(list(tmp_path.iterdir())) == 2


def test_streaming_split_takes_the_end_of_every_span(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With spans of 1,000 tokens and shards of 700, the train shards hold the first 900
    of each span and validation the last 100; the final 430 split 387 + 43."""
    monkeypatch.setattr(prepare, "SPAN_TOKENS", 1000)
    text = VILLAGE[:5430]
    dataset = make(tmp_path, text_file(tmp_path, text), tokenizer="bytes", shard_tokens=700)
    tokens = ByteTokenizer().encode(text)
    spans = [tokens[i : i + 1000] for i in range(0, len(tokens), 1000)]
    cuts = [int(len(s) * 0.9) for s in spans]
    train = np.concatenate([s[:c] for s, c in zip(spans, cuts, strict=True)])
    validation = np.concatenate([s[c:] for s, c in zip(spans, cuts, strict=True)])
    assert cuts[-1] == 387 and len(validation) == 543
    np.testing.assert_array_equal(read_split(dataset, "train"), train)
    np.testing.assert_array_equal(read_split(dataset, "validation"), validation)
    assert [s.tokens for s in dataset.shards("train")] == [700] * 6 + [687]
    assert [s.name for s in dataset.shards("train")][-1] == "train-00006.bin"


def test_directories_and_jsonl(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    text_file(folder, "first file, no newline", "b/one.txt")
    text_file(folder, "# notes\n", "a/notes.md")
    lines = ['{"text": "doc one"}', "", '{"text": "doc two\\n", "id": 7}']
    text_file(folder, "\n".join(lines) + "\n", "c.jsonl")
    text_file(folder, "left out", "image.png")
    text_file(folder, "left out", ".hidden/x.txt")
    text_file(folder, VILLAGE, "d/village.txt")
    # the output lies inside the input: what it holds is not read back
    dataset = make(tmp_path, folder, tokenizer="bytes", output=folder / "data")
    joined = "# notes\nfirst file, no newline\ndoc one\ndoc two\n" + VILLAGE
    tokens = np.concatenate([read_split(dataset, "train"), read_split(dataset, "validation")])
    assert dataset.manifest.totals["tokens"] == len(joined.encode())
    assert [Path(i.path).name for i in dataset.manifest.inputs] == [
        "notes.md",
        "one.txt",
        "c.jsonl",
        "village.txt",
    ]
    assert dataset.manifest.totals["documents"] == 5
    np.testing.assert_array_equal(np.sort(tokens), np.sort(ByteTokenizer().encode(joined)))
    train = read_split(dataset, "train")
    assert bytes(train[:45].astype(np.uint8)) == joined[:45].encode()
    again = make(tmp_path, folder, tokenizer="bytes", output=folder / "data", overwrite=True)
    assert again.manifest.shards == dataset.manifest.shards


def test_bpe_shards_are_the_encoded_text(tmp_path: Path) -> None:
    dataset = make(tmp_path, text_file(tmp_path), tokenizer="bpe", vocab_size=300)
    assert dataset.vocab_size == 300 and dataset.tokenizer.name == "bpe"
    tokens = dataset.tokenizer.encode(VILLAGE)
    split = int(len(tokens) * 0.9)
    np.testing.assert_array_equal(read_split(dataset, "train"), tokens[:split])
    np.testing.assert_array_equal(read_split(dataset, "validation"), tokens[split:])
    hugging_face = tmp_path / "tokenizer.json"
    hugging_face.write_text(json.dumps(json.loads(dataset.tokenizer.to_json())["tokenizer"]))
    again = make(tmp_path, text_file(tmp_path), tokenizer=str(hugging_face), output=tmp_path / "b")
    np.testing.assert_array_equal(read_split(again, "train"), tokens[:split])


def test_a_large_vocabulary_is_stored_as_uint32(tmp_path: Path) -> None:
    text = "".join(map(chr, range(0x10000, 0x10000 + 70_000)))
    dataset = make(tmp_path, text_file(tmp_path, text))
    assert dataset.vocab_size == 70_000 and dataset.manifest.dtype == "uint32"
    np.testing.assert_array_equal(read_split(dataset, "train"), np.arange(63_000))


def shards_of_letters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PreparedDataset:
    """Three train shards of 1,000 tokens: all `a`, all `b`, all `c`."""
    monkeypatch.setattr(prepare, "SPAN_TOKENS", 1000)
    text = "".join(letter * 900 + "z" * 100 for letter in "abc")
    return make(tmp_path, text_file(tmp_path, text), shard_tokens=900)


def test_windows_stay_in_one_shard_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dataset = shards_of_letters(tmp_path, monkeypatch)
    assert [s.tokens for s in dataset.shards("train")] == [900, 900, 900]
    x, y = dataset.batches("train", 50, 8, 600, (0,))
    windows = np.concatenate([x, y[..., -1:]], axis=-1).reshape(-1, 601)
    assert all(len(np.unique(w)) == 1 for w in windows)
    assert set(np.unique(windows)) == {0, 1, 2}  # every shard is drawn from
    again, _ = dataset.batches("train", 50, 8, 600, (0,))
    np.testing.assert_array_equal(x, again)
    assert not np.array_equal(x, dataset.batches("train", 50, 8, 600, (1,))[0])
    _, second_half = dataset.batches("train", 20, 8, 100, (0,), shard=(1, 2))
    assert set(np.unique(second_half)) <= {1, 2}
    dataset.check_block_size(298)
    with pytest.raises(DataError, match=r"block size 299 .* longest validation shard has 300"):
        dataset.check_block_size(299)


def test_a_dataset_restricted_to_named_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = shards_of_letters(tmp_path, monkeypatch)
    mine = dataset.restricted(["train-00002.bin", "train-00000.bin"])
    assert [s.name for s in mine.shards("train")] == ["train-00002.bin", "train-00000.bin"]
    x, _ = mine.batches("train", 30, 8, 50, (0,))
    assert set(np.unique(x)) == {0, 2}
    assert mine.tokens("validation") == dataset.tokens("validation") == 300
    with pytest.raises(DataError, match=r"has no train shard val-00000\.bin"):
        dataset.restricted(["val-00000.bin"])


def test_shards_may_live_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that fetched its shards into a cache by hash reads them from there, with
    the manifest the shepherd sent as JSON."""
    dataset = shards_of_letters(tmp_path, monkeypatch)
    shard = dataset.shards("train")[1]
    cached = tmp_path / "cache" / shard.sha256
    cached.parent.mkdir()
    cached.write_bytes((tmp_path / "data" / shard.name).read_bytes())
    sent = json.loads(json.dumps(dataset.manifest.to_dict()))
    mine = PreparedDataset(
        tmp_path / "nowhere", parse_manifest(sent), [shard.name], {shard.name: cached}
    )
    mine.verify([shard.name])
    x, _ = mine.batches("train", 4, 8, 50, (0,))
    assert set(np.unique(x)) == {1}
    with pytest.raises(DataError, match=r"shard val-00000\.bin: .*nowhere"):
        mine.batches("validation", 1, 1, 8, (0,))


def test_verify_names_the_damaged_shard(tmp_path: Path) -> None:
    dataset = make(tmp_path, text_file(tmp_path), shard_tokens=65_536 // 2)
    dataset.verify()
    damaged = tmp_path / "data" / "train-00001.bin"
    data = bytearray(damaged.read_bytes())
    data[10] ^= 1
    damaged.write_bytes(bytes(data))
    dataset.verify(["train-00000.bin", "val-00000.bin"])
    with pytest.raises(DataError, match=r"shard train-00001\.bin .* does not match its manifest"):
        dataset.verify()
    with pytest.raises(DataError, match=r"has no shard nope\.bin"):
        dataset.verify(["nope.bin"])
    damaged.write_bytes(bytes(data[:-2]))
    with pytest.raises(DataError, match=r"shard train-00001\.bin has .* bytes"):
        read_manifest(tmp_path / "data")


def test_the_chars_source_opens_a_prepared_directory(tmp_path: Path) -> None:
    make(tmp_path, text_file(tmp_path))
    assert isinstance(load_text_file(tmp_path / "data"), PreparedDataset)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"without manifest\.json.*pcp data prepare"):
        load_text_file(tmp_path / "empty")


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("inputs", "options", "message"),
    [
        (lambda d: [], {}, "no inputs"),
        (lambda d: [d / "missing.txt"], {}, "input not found: .*missing.txt"),
        (lambda d: [write_bytes(d / "e.txt", b"")], {}, "nothing to read"),
        (lambda d: [write_bytes(d / "e.jsonl", b"\n\n")], {}, "nothing to read"),
        (lambda d: [(d / "sub").mkdir() or d / "sub"], {}, r"holds no \*.txt, \*.md or \*.jsonl"),
        (lambda d: [write_bytes(d / "l.txt", b"ok \xff\xfe")], {}, "l.txt is not UTF-8 text"),
        (lambda d: [write_bytes(d / "b.txt", b"ab\0cd" * 20)], {}, "b.txt looks binary"),
        (
            lambda d: [write_bytes(d / "x.jsonl", b'{"text": "a"}\n{"text": 1}\n')],
            {},
            'x.jsonl:2: "text" is int, not a string',
        ),
        (lambda d: [write_bytes(d / "y.jsonl", b"{oops\n")], {}, "y.jsonl:1: not valid JSON"),
        (lambda d: [write_bytes(d / "z.jsonl", b'["text"]\n')], {}, "z.jsonl:1: expected a JSON"),
        (lambda d: [text_file(d)], {"vocab_size": 500}, "--vocab-size is for --tokenizer bpe"),
        (lambda d: [text_file(d)], {"tokenizer": "bpe", "vocab_size": 100}, "at least 257"),
        (lambda d: [text_file(d)], {"tokenizer": "bpe", "vocab_size": 2**32 + 1}, "at most 4,2"),
        (lambda d: [text_file(d)], {"tokenizer": "words"}, "unknown --tokenizer 'words'"),
        (lambda d: [text_file(d)], {"tokenizer": "t.json"}, "tokenizer file not found"),
        (lambda d: [text_file(d)], {"validation_fraction": 1.0}, "between 0 and 1"),
        (lambda d: [text_file(d)], {"shard_tokens": 10}, "--shard-tokens must be at least"),
        (lambda d: [text_file(d, "x" * 100)], {}, "too little text in .*corpus.txt: 100 tokens"),
    ],
)
def test_bad_input_is_a_data_error(
    tmp_path: Path, inputs: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(DataError, match=message) as error:
        make(tmp_path, *inputs(tmp_path), **options)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


def test_a_vocabulary_too_large_for_the_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prepare, "MAX_VOCAB", 40)  # as if 2^32 were 40
    with pytest.raises(DataError, match="the tokenizer has 51 tokens; a shard holds at most 40"):
        make(tmp_path, text_file(tmp_path))
    assert not (tmp_path / "data").exists()


def test_an_output_that_holds_something_else_is_refused(tmp_path: Path) -> None:
    source = text_file(tmp_path)
    make(tmp_path, source)
    with pytest.raises(DataError, match=r"already holds a prepared dataset .*--overwrite"):
        make(tmp_path, source, tokenizer="bytes")
    (tmp_path / "data" / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"holds files that are not a prepared dataset \(notes"):
        make(tmp_path, source, overwrite=True)
    with pytest.raises(DataError, match="exists and is not a directory"):
        make(tmp_path, source, output=source)


def test_a_failure_half_way_leaves_no_manifest_and_no_shards(tmp_path: Path) -> None:
    """An earlier dataset is replaced only as a whole: after a failure while writing its
    replacement, the directory holds neither (a rerun may write there again)."""
    source = text_file(tmp_path)
    make(tmp_path, source)
    bad = write_bytes(tmp_path / "late.jsonl", b'{"text": "fine"}\n' * 10 + b"{broken\n")
    with pytest.raises(DataError, match=r"late\.jsonl:11"):
        make(tmp_path, source, bad, tokenizer="bytes", overwrite=True, shard_tokens=65_536)
    assert list((tmp_path / "data").iterdir()) == []
    make(tmp_path, source, tokenizer="bytes")


TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32"]


@pytest.mark.parametrize(
    "tokenizer",
    [
        ["--tokenizer", "chars"],
        # the same path with another vocabulary size: slow (a second compile) for little
        pytest.param(["--tokenizer", "bpe"], marks=pytest.mark.slow),
    ],
)
def test_train_from_a_prepared_dataset(tmp_path: Path, tokenizer: list[str]) -> None:
    source = text_file(tmp_path, corpus.generate(100_000))
    extra = ["--vocab-size", "300"] if "bpe" in tokenizer else []
    done = run_pcp("data", "prepare", str(source), "-o", str(tmp_path / "data"), *tokenizer, *extra)
    assert done.returncode == 0, done.stderr
    assert "validation tokens in 2 shard(s)" in done.stdout
    out = tmp_path / "run"
    steps = ["--steps", "20", "--steps-per-call", "10", "--eval-every", "0"]
    result = run_pcp("train", "--data", str(tmp_path / "data"), *steps, "--out", str(out), *TINY)
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    vocab = 300 if extra else len(set(source.read_text()))
    assert np.isfinite(summary["final_val_loss"]) and summary["final_val_loss"] < np.log(vocab)
    assert summary["unigram_entropy"] == read_manifest(tmp_path / "data").train_unigram_entropy


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    done = run_pcp("data", "prepare", str(tmp_path / "nothing.txt"), "-o", str(tmp_path / "d"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: input not found: {tmp_path}/nothing.txt"]
    (tmp_path / "plain").mkdir()
    done = run_pcp("train", "--data", str(tmp_path / "plain"), "--steps", "10")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "without manifest.json, not a prepared dataset: prepare one with `pcp data prepare" in (
        done.stderr
    )
