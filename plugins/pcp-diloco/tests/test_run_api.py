"""A DiLoCo run with two local workers, started from Python without the CLI."""

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pcp_core import run
from pcp_core.config import ConfigError, RunConfig


def rounds_recorded(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return sum(1 for line in lines if '"round"' in line)


@pytest.mark.slow
def test_a_diloco_run_from_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Also: the shepherd writes a round's checkpoint off its round loop. Each write here
    is held until the round's metrics record appears, which the loop writes after it
    hands the checkpoint over: a write on the loop would wait out its deadline."""
    from pcp_core.program.training import TrainingSetup

    write, writes = TrainingSetup.save_checkpoint, []

    def held(setup: TrainingSetup, run_dir: Path, params: Any, step: int, *rest: Any) -> None:
        deadline = time.monotonic() + 20
        while rounds_recorded(run_dir) < step // 10 and time.monotonic() < deadline:
            time.sleep(0.02)
        writes.append((threading.current_thread().name, step, rounds_recorded(run_dir)))
        write(setup, run_dir, params, step, *rest)

    monkeypatch.setattr(TrainingSetup, "save_checkpoint", held)
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
    assert writes == [("checkpoint", step, step // 10) for step in (10, 20, 30, 40)]
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
