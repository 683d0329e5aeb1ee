"""PCP's own model, dataset, algorithm, codec, aggregators, metrics writer and launchers (Slurm,
MPI, Kubernetes), registered as plugins are.

Each hook imports what it registers when it is called, not at the top: plugin
discovery runs on every `pcp` start, and `pcp --help` must not pay for the model.
"""

from typing import Any

from pcp_core.algorithms import Algorithm, RunContext
from pcp_core.hookspecs import hookimpl


@hookimpl
def pcp_register_models(register) -> None:
    from pcp_core.program.nanogpt import MODEL  # here: keeps `pcp --help` fast

    register(MODEL)


@hookimpl
def pcp_register_datasets(register) -> None:
    from pcp_core.data.text import CHAR_TEXT  # here: keeps `pcp --help` fast

    register(CHAR_TEXT)


def _run_local(ctx: RunContext) -> dict[str, Any]:
    from pcp_core.local.training import run_local  # here: keeps `pcp --help` fast

    return run_local(ctx)


@hookimpl
def pcp_register_algorithms(register) -> None:
    register(
        Algorithm(
            name="local",
            run=_run_local,
            description="single process, single device",
            resumable=True,
        )
    )


@hookimpl
def pcp_register_codecs(register) -> None:
    from pcp_core.codecs import FLOAT32

    register(FLOAT32)


@hookimpl
def pcp_register_aggregators(register) -> None:
    from pcp_core.aggregators import MEAN
    from pcp_core.shepherd.robust import (  # here: keeps `pcp --help` fast
        CENTERED_CLIP,
        GEOMETRIC_MEDIAN,
        MEDIAN,
        TRIMMED_MEAN,
    )

    for aggregator in (MEAN, CENTERED_CLIP, TRIMMED_MEAN, MEDIAN, GEOMETRIC_MEDIAN):
        register(aggregator)


@hookimpl
def pcp_register_metric_sinks(register) -> None:
    from pcp_core.watch.metrics import JSONL  # here: keeps `pcp --help` fast

    register(JSONL)


@hookimpl
def pcp_register_launchers(register) -> None:
    from pcp_core.launch.kubernetes import KUBERNETES  # here: keeps `pcp --help` fast
    from pcp_core.launch.mpi import MPI
    from pcp_core.launch.slurm import SLURM

    register(SLURM)
    register(MPI)
    register(KUBERNETES)
