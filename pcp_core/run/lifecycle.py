"""A run from start to end, the same for `pcp train`, `pcp shepherd` and Python code:
refuse a directory that holds another run, open the status endpoint, the metric sinks
and the dashboard, run the algorithm, then write the summary and the loss plot.

    from pcp_core import run
    from pcp_core.config import RunConfig

    summary = run.train(RunConfig(steps=100, out="runs/first"))
"""

import contextlib
import sys
from pathlib import Path
from typing import Any

import structlog

from pcp_core import config as run_config
from pcp_core import config_file, plugins
from pcp_core.algorithms import Algorithm, RunContext
from pcp_core.config_file import declared_settings
from pcp_core.program.checkpoint import CheckpointWriteError
from pcp_core.shepherd.distributed import Endpoint, local_devices, open_endpoint
from pcp_core.watch.dashboard import Dashboard
from pcp_core.watch.metrics import open_metrics
from pcp_core.watch.plots import write_loss_png
from pcp_core.watch.run_directory import (
    earlier_run,
    new_run_dir,
    remove_earlier_run,
    start_run_dir,
    write_json,
)
from pcp_core.watch.run_status import RunStatus
from pcp_core.watch.status_server import serving

log = structlog.get_logger(__name__)


def train(
    config: run_config.RunConfig,
    local_workers: bool = True,
    resume: bool = False,
    overwrite: bool = False,
    dashboard: bool | None = None,
) -> dict[str, Any]:
    """Run the configured algorithm into a run directory and return its summary (with
    `run_dir`); what `pcp train` (local workers) and `pcp shepherd` (none) call.

    With `local_workers`, a distributed algorithm starts its own workers on this machine;
    with `resume`, it continues the run in `config.out` from its checkpoint. A directory
    that already holds a run is refused unless `resume` or `overwrite` (which deletes
    the earlier run's files once every check has passed). `dashboard` (default: when
    stderr is a terminal) shows the live dashboard instead of progress log lines.
    Errors a user can fix are `pcp_core.config.ConfigError` and the others the CLI turns
    into one line (`pcp_core.cli.common.user_errors`).
    """
    host = plugins.host()
    config = config_file.with_plugin_settings(config.validate(), declared_settings(host))
    algorithm = _algorithm(host, config, resume)
    run_dir = Path(config.out) if config.out else new_run_dir()
    if not (resume or overwrite) and (found := earlier_run(run_dir)):
        raise run_config.ConfigError(
            f"{run_dir} already holds a run ({', '.join(found)}): pass --resume {run_dir} "
            "to continue it or --overwrite to replace it, or choose another --out"
        )
    distributed = algorithm.worker_round is not None
    _check_backends(host, config, distributed, local_workers)
    if dashboard is None:
        dashboard = sys.stderr.isatty()
    status = RunStatus(log_progress=not dashboard)
    status.describe(algorithm=config.algorithm, backend=config.backend, run_dir=str(run_dir))
    with contextlib.ExitStack() as stack:
        endpoint = _open_endpoint(stack, config, host, local_workers) if distributed else None
        stack.enter_context(serving(status, config.status_host, config.status_port))
        if overwrite:
            remove_earlier_run(run_dir)
        start_run_dir(run_dir, config)
        metrics = open_metrics(
            host.metric_sinks(), run_dir, config_file.to_dict(config), resume, (status.record,)
        )
        stack.callback(metrics.close)
        if dashboard:
            stack.enter_context(Dashboard(status))
        ctx = RunContext(
            config=config,
            run_dir=run_dir,
            metrics=metrics,
            plugins=host,
            progress=status,
            status=status,
            local_workers=local_workers,
            resume=resume,
            endpoint=endpoint,
        )
        summary = _run(algorithm, ctx, status)
    return _finish(run_dir, summary)


def _algorithm(host: plugins.PluginHost, config: run_config.RunConfig, resume: bool) -> Algorithm:
    """The run's algorithm, its other plugins looked up first: unknown names fail early."""
    algorithm = host.algorithm(config.algorithm)
    host.model(config.model)  # unknown names fail here, before --overwrite deletes anything
    host.dataset(config.dataset)
    host.optimizer(config.optimizer)
    if resume and not algorithm.resumable:
        raise run_config.ConfigError(f"algorithm {config.algorithm!r} cannot resume a run")
    return algorithm


def _check_backends(
    host: plugins.PluginHost,
    config: run_config.RunConfig,
    distributed: bool,
    local_workers: bool,
) -> None:
    """Refuse a precision or device the training backends lack, before any work; warn if slow."""
    trainers = config.local_worker_backends() if distributed else [config.backend]
    for name in sorted({config.backend, *trainers}):
        host.backend(name).check_precision(config.precision)  # fail before any work
    for name in sorted(set(trainers)):
        host.backend(name).warn_if_slow(config.precision)
    if local_workers:  # no worker starts, to crash and be restarted, without a device
        for name in sorted(set(trainers)):
            backend = host.backend(name)
            backend.runtime.require_device(backend, config.device)
        if distributed:
            local_devices(config, host)  # enough devices for --devices-per-worker


def _open_endpoint(
    stack: contextlib.ExitStack,
    config: run_config.RunConfig,
    host: plugins.PluginHost,
    local_workers: bool,
) -> Endpoint:
    """The secret, TLS files and port of a distributed run, bound now, closed with `stack`."""
    endpoint = open_endpoint(config, host, local_workers)
    stack.callback(endpoint.close)
    return endpoint


def _run(algorithm: Algorithm, ctx: RunContext, status: RunStatus) -> dict[str, Any]:
    """The algorithm's summary, the run's state set to how it ended."""
    try:
        summary = algorithm.run(ctx)
    except KeyboardInterrupt:
        status.set_state("interrupted", quiet=True)  # the CLI says it
        raise
    except BaseException:
        status.set_state("failed", quiet=True)  # the CLI prints the error
        raise
    status.set_state("done")
    return summary


def _finish(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Write the summary and the loss plot; raise if the last checkpoint was not written."""
    try:
        write_json(run_dir / "summary.json", summary)
        write_loss_png(run_dir)
    except OSError as error:
        log.error("summary not written", run_dir=str(run_dir), error=error.strerror or str(error))
    if summary.get("checkpoint_error"):
        raise CheckpointWriteError(
            f"the run trained to its end, but its last checkpoint was not written "
            f"({summary['checkpoint_error']}); the previous one is kept"
        )
    return summary | {"run_dir": str(run_dir)}
