"""A real run's settings and metrics land in MLflow (a local SQLite store, read back with
MLflow's own client): every record, under the core's tags, and a resumed run goes on in
the same MLflow run."""

import json
import os
import subprocess
import sys
from pathlib import Path

from pcp_mlflow import MLFLOW, RUN_DIR_TAG, STORE

from pcp_core import plugins

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16"]
SHORT = ["--batch-size", "4", "--steps-per-call", "10", "--eval-every", "20", *TINY]


def train(*args: str, env: dict[str, str]) -> None:
    command = [sys.executable, "-m", "pcp_core", "train", "--backend", "cpu", *SHORT, *args]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def test_the_plugin_registers_its_sink() -> None:
    assert plugins.host().registries["metric_sink"].get("mlflow") is MLFLOW


def test_a_run_and_its_resumption_in_one_mlflow_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run = tmp_path / "runs" / "village"
    env = {"MLFLOW_TRACKING_URI": "", "MLFLOW_EXPERIMENT_NAME": ""}  # the default store
    train("--steps", "20", "--out", str(run), env=env)
    train("--resume", str(run), "--steps", "40", env=env)
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / STORE}")
    experiment = client.get_experiment_by_name("pcp")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == "village"
    assert found.data.tags[RUN_DIR_TAG] == str(run.resolve())
    assert found.data.params["steps"] == "20" and found.data.params["backend"] == "cpu"
    assert found.info.status == "FINISHED"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = history(client, found.info.run_id, "loss/train")
    assert losses == [(r["step"], r["loss"]) for r in records]  # steps 10 to 40
    validation = history(client, found.info.run_id, "loss/val")
    assert [step for step, _ in validation] == [20, 40]


def test_mlflows_own_settings_choose_the_store_and_the_experiment(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "village"}
    train("--steps", "10", "--out", str(tmp_path / "run"), env=env)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("village")
    assert len(client.search_runs([experiment.experiment_id])) == 1
    assert not (tmp_path / STORE).exists()
