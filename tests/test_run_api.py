"""Training from Python, without the CLI: `pcp_core.run.train` is what `pcp train` calls."""

import json
import math
from pathlib import Path

import pytest

from pcp_core import run
from pcp_core.config import ConfigError, RunConfig

TINY = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32}


def test_a_local_run_from_python_writes_its_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "run"
    summary = run.train(RunConfig(steps=20, eval_every=10, out=out, **TINY), dashboard=False)
    assert summary["run_dir"] == str(out)
    assert math.isfinite(summary["final_val_loss"])
    assert json.loads((out / "summary.json").read_text())["final_val_loss"] == pytest.approx(
        summary["final_val_loss"]
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 20
    assert (out / "config.toml").is_file() and (out / "checkpoint.safetensors").is_file()


def test_a_bad_setting_from_python_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="steps"):
        run.train(RunConfig(steps=0, out=tmp_path / "run", **TINY), dashboard=False)
    assert not (tmp_path / "run").exists()


def test_a_run_directory_is_not_overwritten_from_python_either(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run.train(RunConfig(steps=10, eval_every=0, out=out, **TINY), dashboard=False)
    with pytest.raises(ConfigError, match="already holds a run"):
        run.train(RunConfig(steps=10, eval_every=0, out=out, **TINY), dashboard=False)
