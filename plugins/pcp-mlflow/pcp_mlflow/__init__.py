"""Every PCP run in MLflow: its settings as parameters, each metrics record as metrics.

Installed where runs start, the plugin opens with every run. Where it writes is MLflow's
own setting, `MLFLOW_TRACKING_URI` (a server, `http://...`, or a database); without one,
a SQLite store beside the run directory, `RUN_DIR/../mlflow.db`, so the runs of one
folder are side by side (`mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`). The
experiment is `MLFLOW_EXPERIMENT_NAME`, else `pcp`; the MLflow run is named after the
run directory and tagged with its path, so a resumed run (`--resume`) goes on in the same
MLflow run. The metric names are the core's tags (`pcp_core.watch.scalars`), as in
TensorBoard. The client is imported when a run opens the sink, never when the plugin is
loaded; each record is sent as it is written (a server that fails drops the sink, with
one line, and the run goes on).
"""

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pcp_core import hookimpl
from pcp_core.watch.metrics import MetricSink
from pcp_core.watch.scalars import Throughput, scalars, step_of

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for

STORE = "mlflow.db"  # beside the run directory, without MLFLOW_TRACKING_URI
EXPERIMENT = "pcp"
RUN_DIR_TAG = "pcp.run_dir"
PARAM_CHARACTERS = 6000  # MLflow's longest parameter value


def tracking_uri(run_dir: Path) -> str:
    """MLFLOW_TRACKING_URI, else the SQLite store beside `run_dir`."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{run_dir.resolve().parent / STORE}"


def flattened(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """The run's settings as MLflow parameters: nested tables as dotted names."""
    params: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            params |= flattened(value, f"{prefix}{key}.")
        else:
            params[prefix + key] = str(value)[:PARAM_CHARACTERS]
    return params


class MlflowWriter:
    """One PCP run's MLflow run, opened by its first record."""

    def __init__(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        from mlflow.tracking import MlflowClient  # here: loading the plugin stays cheap

        self.run_dir, self.config, self.resume = run_dir.resolve(), config, resume
        self.client = MlflowClient(tracking_uri(run_dir))
        self.run_id: str | None = None
        self.records = 0
        self.throughput = Throughput()

    def write(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        if self.run_id is None:
            self.run_id = self._open()
        values = scalars(record)
        rate = self.throughput.tokens_per_s(record)
        if rate is not None:
            values["throughput/tokens_per_s"] = rate
        step, now = step_of(record, self.records), int(time.time() * 1000)
        metrics = [Metric(tag, value, now, step) for tag, value in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)
        self.records += 1

    def _open(self) -> str:
        """The MLflow run of this run directory: the one it had, when resumed."""
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        experiment = self.client.get_experiment_by_name(experiment_name)
        if experiment is None:
            experiment_id = self.client.create_experiment(experiment_name)
        else:
            experiment_id = experiment.experiment_id
        if self.resume:
            earlier = self.client.search_runs(
                [experiment_id],
                filter_string=f"tags.`{RUN_DIR_TAG}` = '{self.run_dir}'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            if earlier:
                run_id = earlier[0].info.run_id
                self.client.update_run(run_id, status="RUNNING")
                return run_id
        run = self.client.create_run(
            experiment_id, run_name=self.run_dir.name, tags={RUN_DIR_TAG: str(self.run_dir)}
        )
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flattened(self.config).items()]
        for first in range(0, len(params), 100):  # MLflow takes 100 parameters a batch
            self.client.log_batch(run.info.run_id, params=params[first : first + 100])
        return run.info.run_id

    def keep_only(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        """The run resumes: its next record has no record before it (its steps again
        are later points of the same metrics)."""
        self.throughput.restart()

    def close(self) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id)
            self.run_id = None


MLFLOW = MetricSink(
    name="mlflow",
    open=MlflowWriter,
    description="MLflow: MLFLOW_TRACKING_URI, else the SQLite store RUN_DIR/../mlflow.db",
)


@hookimpl
def pcp_register_metric_sinks(register) -> None:
    register(MLFLOW)
