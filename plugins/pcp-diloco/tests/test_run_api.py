"""A DiLoCo run with two local workers, started from Python without the CLI."""

import json
import math
from pathlib import Path

import pytest

from pcp_core import run
from pcp_core.config import ConfigError, RunConfig


@pytest.mark.slow
def test_a_diloco_run_from_python(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = RunConfig(
        algorithm="diloco",
        steps=40,
        eval_every=0,
        out=out,
        plugins={"diloco": {"inner_steps": 10}, "shepherd": {"workers": 2}},
        **{"n_layer": 1, "n_head": 2, "n_embd": 64, "block_size": 32, "batch_size": 8},
    )
    summary = run.train(config, dashboard=False)
    assert math.isfinite(summary["final_train_loss"])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rounds = [r for r in records if "round" in r]
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert all(r["workers"] == 2 for r in rounds)
    # every worker's time is accounted for: compute, waiting, sending
    for record in rounds:
        assert 0 < record["compute_utilisation"] <= 1
        for key in ("worker_compute_s", "worker_wait_s", "worker_send_s"):
            assert set(record[key]) == {"0", "1"} and min(record[key].values()) >= 0
    assert 0 < summary["compute_utilisation"] <= 1 and set(summary["worker_seconds"]) == {"0", "1"}
    assert summary["compute_utilisation"] == pytest.approx(
        sum(w["compute_s"] for w in summary["worker_seconds"].values())
        / (2 * summary["training_s"]),
        rel=1e-3,
    )


def test_diloco_settings_from_python_are_checked_by_name(tmp_path: Path) -> None:
    config = RunConfig(
        algorithm="diloco", out=tmp_path / "run", plugins={"diloco": {"outer_lr": 0}}
    )
    with pytest.raises(ConfigError, match=r"^diloco.outer_lr must be positive, got 0"):
        run.train(config, dashboard=False)
    assert not (tmp_path / "run").exists()
