"""`pcp train` end to end in a fresh interpreter, and its one-line errors."""

import json
from pathlib import Path

import pytest

from pcp_core.program import checkpoint
from tests.conftest import run_pcp

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32"]


def test_train_writes_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_pcp(
        "train", "--backend", "cpu", "--steps", "60", "--eval-every", "30", "--out", str(out), *TINY
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(10, 70, 10))
    assert all({"step", "loss", "tokens", "elapsed_s"} <= set(r) for r in records)
    assert [r["step"] for r in records if "val_loss" in r] == [30, 60]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == "cpu" and summary["tokens_per_s"] > 0
    assert summary["final_val_loss"] < 0.9 * summary["unigram_entropy"]  # it learned
    assert (out / "config.toml").read_text().count("steps = 60") == 1
    params, metadata = checkpoint.load(out / "checkpoint.safetensors")
    assert "wte" in params and params["wte"].shape[1] == 32
    assert metadata["step"] == "60" and json.loads(metadata["model_config"])["n_embd"] == 32


def test_config_file_and_flags(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text("steps = 1000\nbatch_size = 4\n")
    out = tmp_path / "run"
    result = run_pcp("train", "--config", str(toml), "--steps", "10", "--out", str(out), *TINY)
    assert result.returncode == 0, result.stderr
    config = (out / "config.toml").read_text()
    assert "steps = 10\n" in config and "batch_size = 4\n" in config


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data", "/nonexistent/corpus.txt"], "data not found"),
        (["--block-size", "100000"], "block size 100000 is too big"),
        (["--steps", "-3"], "steps must be positive"),
        (["--n-embd", "30", "--n-head", "4"], "divisible by n_head"),
        (["--steps", "15", "--steps-per-call", "10"], "multiple of steps_per_call"),
        (["--model-settings", "n_layer=x"], "expected KEY=INTEGER, got 'n_layer=x'"),
        (["--model-settings", "depth=3"], "has no setting(s) ['depth']"),
        (["--lr", "nan"], "lr must be a finite number, got nan"),
        (["--beta2", "1"], "beta2 must be in [0, 1), got 1.0"),
        (["--min-lr", "0.1"], "min_lr must not be above lr, got min_lr 0.1 and lr 0.003"),
        (["--outer-lr", "0"], "diloco.outer_lr must be positive, got 0.0"),
        (["--join-timeout", "-1"], "join_timeout must not be negative, got -1.0"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    result = run_pcp("train", *args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_model_settings_reach_the_model(tmp_path: Path) -> None:
    """--model-settings sets any model's own settings (here nanoGPT's, as the flags do)."""
    out = tmp_path / "run"
    settings = "n_layer=1,n_head=2,n_embd=16,block_size=16"
    result = run_pcp("train", "--model-settings", settings, "--steps", "10", "--out", str(out))
    assert result.returncode == 0, result.stderr
    params, _ = checkpoint.load(out / "checkpoint.safetensors")
    assert params["wte"].shape[1] == 16 and "h.1.ln_1.weight" not in params


def test_diverging_run_stops_without_checkpointing_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_pcp(
        "train", "--lr", "1e12", "--steps", "20", "--eval-every", "10", "--out", str(out), *TINY
    )
    assert result.returncode == 2
    assert "loss became nan at step 10" in result.stderr and "Traceback" not in result.stderr
    assert not (out / "checkpoint.safetensors").exists()


def test_unknown_config_key_is_one_line(tmp_path: Path) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text("learning_rate = 3\n")
    result = run_pcp("train", "--config", str(toml))
    assert result.returncode == 2 and "unknown key 'learning_rate'" in result.stderr
    assert "Traceback" not in result.stderr


def test_hostile_paths_survive_config_toml(tmp_path: Path) -> None:
    """A run's config.toml reads back through --config and --resume whatever its paths hold."""
    hostile = "a\\b \"double\" 'single'\nnew line ünïcödé ✓  spaces"
    data = tmp_path / f"{hostile}.txt"
    data.write_text((Path(__file__).read_text() + "\n") * 20)
    out = tmp_path / hostile / "run\\"
    result = run_pcp("train", "--data", str(data), "--steps", "10", "--out", str(out), *TINY)
    assert result.returncode == 0, result.stderr
    # both read the file back and validate it (data must exist) before they stop
    resumed = run_pcp("train", "--resume", str(out))
    assert resumed.returncode == 2, resumed.stderr
    assert "has trained its 10 steps; pass a larger --steps" in resumed.stderr
    config = ("--config", str(out / "config.toml"), "--out", str(tmp_path / "other"))
    again = run_pcp("train", *config, "--model", "no-such-model")
    assert again.returncode == 2 and "no-such-model" in again.stderr, again.stderr
    assert "Traceback" not in resumed.stderr + again.stderr


def fake_run(folder: Path) -> dict[str, str]:
    """An earlier run's files, with contents no real run writes."""
    files = {
        "config.toml": "steps = 7\n",
        "metrics.jsonl": '{"step": -1, "loss": 99.0}\n',
        "summary.json": "{}\n",
        "checkpoint.safetensors": "old",
        "checkpoint-previous.safetensors": "older",
        "worker-0.log": "an old worker's log\n",
        "notes.txt": "the user's own file\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "worker-0").mkdir()
    (folder / "worker-0" / "inner-state.safetensors").write_text("old state")
    return files


def test_out_holding_a_run_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    files = fake_run(out)
    for command in (["train"], ["shepherd", "--workers", "1"]):
        result = run_pcp(*command, "--out", str(out), *TINY)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"error: {out} already holds a run (checkpoint")
        assert "--resume" in result.stderr and "--overwrite" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert {name: (out / name).read_text() for name in files} == files
    both = run_pcp("train", "--resume", str(out), "--overwrite")
    assert both.returncode == 2 and "pick one" in both.stderr, both.stderr


def test_overwrite_replaces_the_earlier_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    fake_run(out)
    result = run_pcp("train", "--out", str(out), "--overwrite", "--steps", "10", *TINY)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10]
    assert "steps = 10\n" in (out / "config.toml").read_text()
    assert checkpoint.load(out / "checkpoint.safetensors")[1]["step"] == "10"
    assert not (out / "checkpoint-previous.safetensors").exists()
    assert not (out / "worker-0").exists() and not (out / "worker-0.log").exists()
    assert (out / "notes.txt").read_text() == "the user's own file\n"


@pytest.mark.parametrize("typo", [["--model", "nanogtp"], ["--dataset", "char"]])
def test_overwrite_with_a_typo_keeps_the_earlier_run(tmp_path: Path, typo: list[str]) -> None:
    out = tmp_path / "run"
    files = fake_run(out)
    result = run_pcp("train", "--out", str(out), "--overwrite", *typo, *TINY)
    assert result.returncode == 2 and "unknown" in result.stderr.lower(), result.stderr
    assert {name: (out / name).read_text() for name in files} == files


def test_empty_out_directory_is_fine(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("not a run\n")
    result = run_pcp("train", "--out", str(out), "--steps", "10", *TINY)
    assert result.returncode == 0, result.stderr
    assert (out / "summary.json").is_file()
