"""DiLoCo for PCP (Douillard et al., 2023): workers run H inner steps from the global
parameters; the shepherd averages their pseudo-gradients θ_global − θ_local and applies
the outer optimizer (Nesterov momentum by default)."""

from pcp_core import hookimpl
from pcp_core.algorithms import Algorithm
from pcp_diloco.settings import DilocoSettings, DilocoWorkerSettings

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for


def _run(ctx):
    from pcp_diloco.shepherd_side import run  # here: keeps plugin discovery fast

    return run(ctx)


def _worker_round(session, assignment):
    from pcp_diloco.worker_side import worker_round  # here: keeps plugin discovery fast

    return worker_round(session, assignment)


DILOCO = Algorithm(
    name="diloco",
    run=_run,
    worker_round=_worker_round,
    resumable=True,
    settings=DilocoSettings,
    worker_settings=DilocoWorkerSettings,
    description="DiLoCo: H local steps per round, outer Nesterov step on the shepherd",
)


@hookimpl
def pcp_register_algorithms(register) -> None:
    register(DILOCO)
