"""The character dataset and the run configuration."""

import re
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from pcp_core import config as run_config
from pcp_core import config_file, plugins
from pcp_core.config_file import declared_settings
from pcp_core.data.errors import DataError
from pcp_core.data.text import CharCorpus, load_text_file

DECLARED = declared_settings(plugins.host())  # the installed plugins' settings ([adamw], ...)


def test_tokenizer_round_trip_and_split() -> None:
    text = "hello world, héllo wörld! " * 20
    corpus = CharCorpus.from_text(text, "test")
    assert corpus.vocab_size == len(set(text))
    joined = np.concatenate([corpus.train, corpus.validation])
    assert corpus.decode(joined) == text
    assert len(corpus.validation) == len(text) - int(len(text) * 0.9)


def test_batches_are_deterministic_and_shifted() -> None:
    corpus = load_text_file(None)
    x1, y1 = corpus.batches("train", 3, 4, 16, stream=(7, 1))
    x2, _ = corpus.batches("train", 3, 4, 16, stream=(7, 1))
    x3, _ = corpus.batches("train", 3, 4, 16, stream=(7, 2))
    assert x1.shape == (3, 4, 16) and x1.dtype == np.int32
    np.testing.assert_array_equal(x1, x2)
    assert not np.array_equal(x1, x3)
    np.testing.assert_array_equal(x1[..., 1:], y1[..., :-1])


def test_shards_are_disjoint() -> None:
    """Shard 0 of 2 only ever sees the first half of the training text, shard 1 the second."""
    half = 9_000
    text = "abcdefghij" * (half // 10) + "ABCDEFGHIJ" * (half // 10) + "0123456789" * 200
    corpus = CharCorpus.from_text(text, "halves", validation_fraction=2000 / len(text))
    lower = {corpus.vocabulary.index(c) for c in "abcdefghij"}
    upper = {corpus.vocabulary.index(c) for c in "ABCDEFGHIJ"}
    for stream in range(5):
        _, y0 = corpus.batches("train", 20, 8, 16, stream=(stream,), shard=(0, 2))
        _, y1 = corpus.batches("train", 20, 8, 16, stream=(stream,), shard=(1, 2))
        assert set(np.unique(y0)) <= lower and set(np.unique(y1)) <= upper


def test_default_corpus_is_learnable_size() -> None:
    corpus = load_text_file(None)
    assert len(corpus.train) > 100_000
    assert 2.5 < corpus.unigram_entropy() < 4.0


def test_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_text_file(tmp_path / "missing.txt")
    small = tmp_path / "small.txt"
    small.write_text("x" * 100)
    corpus = load_text_file(small)
    with pytest.raises(DataError, match="block size 64 is too big"):
        corpus.check_block_size(64)


def test_config_precedence_and_errors(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('steps = 40\nlr = 0.01\nbackend = "cpu"\nn-layer = 3\n')
    resolved = config_file.resolve(toml, {"steps": 20, "lr": None})
    assert resolved.steps == 20 and resolved.lr == 0.01 and resolved.n_layer == 3
    toml.write_text("stepz = 4\n")
    with pytest.raises(run_config.ConfigError, match="unknown key 'stepz'"):
        config_file.resolve(toml, {})
    with pytest.raises(run_config.ConfigError, match="steps must be positive"):
        config_file.resolve(None, {"steps": -5})
    toml.write_text('steps = "many"\n')
    with pytest.raises(run_config.ConfigError, match="steps: expected"):
        config_file.resolve(toml, {})


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"lr": float("nan")}, "lr must be a finite number, got nan"),
        ({"lr": float("inf")}, "lr must be a finite number, got inf"),
        ({"worker_timeout": float("nan")}, "shepherd.worker_timeout must be a finite number"),
        ({"beta1": 1.0}, "adamw.beta1 must be in [0, 1), got 1.0"),
        ({"beta2": -0.1}, "adamw.beta2 must be in [0, 1), got -0.1"),
        ({"eps": 0.0}, "adamw.eps must be positive, got 0.0"),
        ({"weight_decay": -0.1}, "adamw.weight_decay must not be negative, got -0.1"),
        ({"grad_clip": -1.0}, "grad_clip must not be negative, got -1.0"),
        ({"join_timeout": -1.0}, "shepherd.join_timeout must not be negative, got -1.0"),
        ({"worker_timeout": -5.0}, "shepherd.worker_timeout must be at least 1, got -5.0"),
        ({"round_timeout": 1e-6}, "shepherd.round_timeout must be at least 1, got 1e-06"),
        ({"lr": 1e-3, "min_lr": 1e-2}, "min_lr must not be above lr, got min_lr 0.01 and lr 0.001"),
    ],
)
def test_out_of_range_settings_are_refused_by_name(
    setting: dict[str, float], message: str, tmp_path: Path
) -> None:
    with pytest.raises(run_config.ConfigError) as refused:
        config_file.resolve(None, setting, declared=DECLARED)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    toml = tmp_path / "run.toml"  # the same from a file: TOML spells nan and inf too
    toml.write_text(tomli_w.dumps(setting))
    with pytest.raises(run_config.ConfigError, match=re.escape(message)):
        config_file.resolve(toml, {}, declared=DECLARED)


def test_edges_of_the_ranges_are_accepted() -> None:
    edges = {"beta1": 0.0, "beta2": 0.999, "weight_decay": 0.0}
    edges |= {"grad_clip": 0.0, "join_timeout": 0.0, "lr": 1e-3, "min_lr": 1e-3}
    resolved = config_file.resolve(None, edges, declared=DECLARED)
    assert resolved.min_lr == 1e-3 and resolved.settings("adamw").beta2 == 0.999


def test_the_decay_ends_at_a_tenth_of_lr_unless_told() -> None:
    """`--lr 1e-4` alone works: the end of the decay follows it (a fixed default of 3e-4
    was above it and refused)."""
    assert config_file.resolve(None, {"lr": 1e-4}).final_lr() == pytest.approx(1e-5)
    assert config_file.resolve(None, {}).final_lr() == pytest.approx(3e-4)
    assert config_file.resolve(None, {"lr": 1e-2, "min_lr": 0.0}).final_lr() == 0.0


def test_resolved_config_round_trips_through_toml(tmp_path: Path) -> None:
    resolved = config_file.resolve(None, {"steps": 20, "data": None, "n_head": 2})
    saved = tmp_path / "config.toml"
    saved.write_text(config_file.to_toml(resolved))
    assert config_file.resolve(saved, {}) == resolved


HOSTILE_NAME = "a\\b \"double\" 'single'\nnew line, ünïcödé ✓ and  spaces "


def test_hostile_paths_round_trip_through_toml(tmp_path: Path) -> None:
    """Backslashes, both quotes, a newline, unicode and spaces in paths read back as written."""
    folder = tmp_path / HOSTILE_NAME
    folder.mkdir()
    data = folder / f"{HOSTILE_NAME}.txt"
    data.write_text("some text " * 100)
    paths = {
        "data": data,
        "out": folder / "run\\",
        "token_file": folder / 'tok"en',
        "tls_cert": folder / "c'ert.pem",
        "tls_key": folder / "key\\n.pem",
    }
    flags = {**paths, "target": 'x86"\\64\n'}
    resolved = config_file.resolve(None, flags, declared=DECLARED)
    saved = tmp_path / "config.toml"
    saved.write_text(config_file.to_toml(resolved), encoding="utf-8")
    again = config_file.resolve(saved, {}, declared=DECLARED)
    assert again == resolved
    read = {name: getattr(again, name) for name in ("data", "out")}
    read |= {name: getattr(again.shepherd, name) for name in ("token_file", "tls_cert", "tls_key")}
    assert read == paths


def test_a_config_from_before_the_sections_still_loads(tmp_path: Path) -> None:
    """Distributed and AdamW settings at the top level, as config files had them before
    `[shepherd]` and `[adamw]`: read as if under their sections (with a warning)."""
    toml = tmp_path / "old.toml"
    toml.write_text('algorithm = "diloco"\nworkers = 3\nworker_timeout = 12.0\nbeta2 = 0.95\n')
    resolved = config_file.resolve(toml, {}, declared=DECLARED)
    assert (resolved.shepherd.workers, resolved.shepherd.worker_timeout) == (3, 12.0)
    assert resolved.settings("adamw").beta2 == 0.95
