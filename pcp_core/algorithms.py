"""What an algorithm plugin provides, and the context every run gets."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pcp_core.config import RunConfig

if TYPE_CHECKING:  # types only: this contract sits below the modules that implement them
    from pcp_core.watch.metrics import Metrics
    from pcp_core.watch.run_status import RunStatus


class Progress(Protocol):
    """Where a run reports progress; the CLI shows it as a progress bar."""

    def start(self, total_steps: int, description: str) -> None: ...

    def update(self, step: int, **fields: float) -> None: ...


class SilentProgress:
    def start(self, total_steps: int, description: str) -> None:
        pass

    def update(self, step: int, **fields: float) -> None:
        pass


@dataclass
class RunContext:
    config: RunConfig
    run_dir: Path
    metrics: "Metrics"
    # The run's pcp_core.plugins.PluginHost (not imported here: the host loads this module).
    plugins: Any
    # What the run is doing now, for the dashboard and the status endpoint: algorithms
    # report worker and run states into it (the run passes the same object as `progress`).
    status: "RunStatus"
    progress: Progress = field(default_factory=SilentProgress)
    # True for the one-command form: the algorithm starts its own local workers.
    local_workers: bool = False
    # True for `--resume RUN_DIR`: continue from the run directory's last good checkpoint.
    resume: bool = False
    # A distributed algorithm's secret and bound listener (pcp_core.shepherd.distributed.Endpoint),
    # opened by the run before the program is built (not imported here: it uses this
    # module); None: the algorithm opens its own.
    endpoint: Any = None


@dataclass(frozen=True)
class Algorithm:
    """Drives a whole run and returns the summary written to summary.json.

    A distributed algorithm also gives `worker_round(session, assignment) -> RoundWork`,
    what a worker does with one round's assignment (see `pcp_core.worker.session`).
    """

    name: str
    run: Callable[[RunContext], dict[str, Any]]
    description: str = ""
    worker_round: Callable[..., Any] | None = None
    resumable: bool = False  # `run` honours RunContext.resume
    # Its own settings: a dataclass of `pcp_core.settings.setting` fields, turned into
    # flags and a TOML section named after it; read with `ctx.config.settings(name)`.
    settings: type | None = None
    # What its worker side is told: a frozen dataclass of JSON-able fields, which `run`
    # puts in its slot of `RunSettings.plugins`; the Setup carries it as JSON and the
    # worker decodes it once, at its join (`WorkerSession.algorithm_settings`).
    worker_settings: type | None = None
