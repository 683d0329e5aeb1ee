"""The engine: the one place an algorithm plugin imports for distributed work.

An algorithm's `run(ctx)` drives a run on the shepherd, and its `worker_round(session,
assignment)` does one round on a worker (docs/plugins.md, "The engine"). What the core
offers them for that is named here, so a plugin depends on this module and not on where
the core keeps each part. Registering the algorithm and declaring its settings need
only the light modules imported when `pcp --help` lists the plugins: `pcp_core`
(`hookimpl`), `pcp_core.algorithms` (`Algorithm`) and `pcp_core.settings` (`setting`,
`MAX_STEPS`, `ConfigError`). This module imports the shepherd's and the worker's
machinery, so a plugin imports it where the run starts, not at discovery.

The run
    `RunContext` (what `run` is given), `RunConfig` (`ctx.config`; a plugin's own
    section is `config.settings(name)`), `ConfigError` (a setting a user can fix),
    `prepare` and the `TrainingSetup` it returns (the data, the model and the exported
    program), `OneInFlight` (a job, such as writing a checkpoint, on a thread of its
    own), `run_local` (the core's one-process loop, where a new algorithm starts), and
    for a setting's check, which has no run context, the plugin host (`host`) and the
    `UnknownNameError` it raises for a name no plugin registers (a run uses
    `ctx.plugins`).

The shepherd's side
    The session: `shepherd(ctx, setup, settings)` listens, admits the workers (and
    starts the local ones) and yields a `Shepherd`; `RunSettings` is what every worker is
    told with its program. Rounds: `Shepherd.run_round` gives each worker its
    `Assignment`, takes the `Result`s in and returns a `RoundOutcome`; a `Scope` is the
    part of the model a round moves. Checks: `StepGuard` undoes an implausible outer
    step, `outliers` and `step_norm` name the results behind it, `SpotChecks` re-runs
    sampled results. Clocks and utilisation: `Utilisation` accounts the workers' time.
    Reports: `outcome_record` gives the fields of a round's metrics record that its
    outcome holds (the aggregator's view of each result, bytes, seconds);
    `worker_losses`, `worker_steps` and `report_results` tell the run status what each
    worker did. Status: `RunStatus` (`ctx.status`). Checkpoints: `load_latest`, `CheckpointError`,
    and `HELD_PREFIX`, the prefix of the workers' copy of the parameters in one.

The worker's side
    The session: `WorkerSession`. Round work: what `worker_round` returns, `RoundWork`,
    and `TransportError`, a link lost in a round; `steps_from_global`, the whole round of
    an algorithm whose workers train from the global parameters every round. Dispatch:
    `dispatch` runs a device call, `set_opt_tensors` and `zero_opt_tensors` set the
    inner optimizer's state.
    Tensors: `Tensor`, a named array as it crosses the wire.

Outer optimizers
    An outer optimizer (`ctx.plugins.optimizer(name)`) makes an `OuterStep` from
    `OuterSettings` (learning rate, momentum) and the parameters it steps:
    `create(settings, params)`. The step moves them in place by the round's mean
    pseudo-gradient and keeps a state a checkpoint saves.
"""

from pcp_core.algorithms import RunContext
from pcp_core.backends import dispatch, set_opt_tensors, zero_opt_tensors
from pcp_core.config import RunConfig
from pcp_core.local.training import run_local
from pcp_core.optimizers import OuterSettings, OuterStep
from pcp_core.plugins import host
from pcp_core.program.background import OneInFlight
from pcp_core.program.checkpoint import CheckpointError, load_latest
from pcp_core.program.training import TrainingSetup, prepare
from pcp_core.registry import UnknownNameError
from pcp_core.settings import ConfigError
from pcp_core.shepherd.aggregation import step_norm
from pcp_core.shepherd.distributed import shepherd
from pcp_core.shepherd.outcomes import RoundOutcome
from pcp_core.shepherd.round_report import (
    outcome_record,
    report_results,
    worker_losses,
    worker_steps,
)
from pcp_core.shepherd.rounds import Scope
from pcp_core.shepherd.session import Shepherd
from pcp_core.shepherd.spot_checks import SpotChecks
from pcp_core.shepherd.step_guard import StepGuard, outliers
from pcp_core.shepherd.utilisation import Utilisation
from pcp_core.watch.run_status import RunStatus
from pcp_core.wire.downlink import HELD_PREFIX
from pcp_core.wire.messages import Assignment, Result, RunSettings, Tensor
from pcp_core.wire.transport import TransportError
from pcp_core.worker.session import RoundWork, WorkerSession, steps_from_global

__all__ = [
    "HELD_PREFIX",
    "Assignment",
    "CheckpointError",
    "ConfigError",
    "OneInFlight",
    "OuterSettings",
    "OuterStep",
    "Result",
    "RoundOutcome",
    "RoundWork",
    "RunConfig",
    "RunContext",
    "RunSettings",
    "RunStatus",
    "Scope",
    "Shepherd",
    "SpotChecks",
    "StepGuard",
    "Tensor",
    "TrainingSetup",
    "TransportError",
    "UnknownNameError",
    "Utilisation",
    "WorkerSession",
    "dispatch",
    "host",
    "load_latest",
    "outcome_record",
    "outliers",
    "prepare",
    "report_results",
    "run_local",
    "set_opt_tensors",
    "shepherd",
    "step_norm",
    "steps_from_global",
    "worker_losses",
    "worker_steps",
    "zero_opt_tensors",
]
