"""Federated averaging (McMahan et al. 2017) for PCP: a distributed algorithm written on
`pcp_core.engine` alone, as a third party would write one.

Each round every worker trains `--average-every` steps from the global model on its
shard of the data and sends back how far it moved; the shepherd moves the global model
by the mean of those changes, so it becomes the mean of the workers' models. That is
DiLoCo with an outer step of plain SGD at learning rate 1, and none of DiLoCo's outer
momentum, fragments, overlapped rounds, budgets or checkpoints (pcp-diloco has them).
"""

from dataclasses import dataclass

from pcp_core import hookimpl
from pcp_core.algorithms import Algorithm
from pcp_core.settings import MAX_STEPS, setting

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for


@dataclass(frozen=True)
class FedAvgSettings:
    average_every: int = setting(
        20, "Steps each worker trains between two averages (a round).", low=1, high=MAX_STEPS
    )


def _run(ctx):
    from pcp_fedavg.rounds import run  # here: keeps `pcp --help` from loading the engine

    return run(ctx)


def _worker_round(session, assignment):
    from pcp_core.engine import steps_from_global  # the round: steps from the global model

    return steps_from_global(session, assignment)


@hookimpl
def pcp_register_algorithms(register) -> None:
    register(
        Algorithm(
            name="fedavg",
            run=_run,
            worker_round=_worker_round,
            settings=FedAvgSettings,
            description="federated averaging: the workers' models averaged every round",
        )
    )
