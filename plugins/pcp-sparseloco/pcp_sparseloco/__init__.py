"""SparseLoCo for PCP (Sarfi, Thérien, Lidin, Belilovsky 2025): DiLoCo's rounds with a
hundred times fewer bytes, written on `pcp_core.engine` alone.

Each worker trains H steps from the global parameters, adds how far it moved to its
error-feedback accumulator (decayed by β each round), sends the largest few values of
each chunk of it at 2 bits each (the `sparse2` codec) and keeps the rest for later
rounds. The shepherd averages what arrives (a value a worker did not send counts as
zero), moves the global parameters by it times the outer learning rate, with no outer
momentum (the accumulators take its place), and sends the change back the same way, so
the bytes are few in both directions.
"""

from dataclasses import dataclass

from pcp_core import hookimpl
from pcp_core.algorithms import Algorithm
from pcp_core.settings import MAX_STEPS, WorkersLrSettings, setting

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for


@dataclass(frozen=True)
class SparseLocoSettings(WorkersLrSettings):
    """What `pcp train --algorithm sparseloco` adds to a run's settings (the workers'
    learning rate for M workers, `--inner-lr-scaling` and `--inner-warmup-steps`, as
    DiLoCo has it)."""

    inner_steps: int = setting(10, "Inner steps per round (H).", low=1, high=MAX_STEPS)
    density: float = setting(
        1 / 16,
        "The share of each chunk of a pseudo-gradient a worker sends a round (the largest "
        "values; the rest waits in its accumulator).",
        low=0,
        low_open=True,
        high=0.5,
    )
    chunk: int = setting(
        4096, "Values in a chunk: the largest of each are sent.", low=64, high=65536
    )
    down_density: float = setting(
        0.1,
        "The share of each chunk of the global parameters' change sent back to the "
        "workers a round (what is not sent yet follows in later rounds).",
        low=0,
        low_open=True,
        high=0.5,
    )
    feedback_decay: float = setting(
        0.95,
        "Each round a worker's accumulator is multiplied by this before its new "
        "pseudo-gradient is added (β).",
        low=0,
        high=1,
    )
    outer_lr: float = setting(
        2.0,
        "Outer learning rate (α): the global parameters move by this times the mean of "
        "the workers' sparse messages.",
        low=0,
        low_open=True,
    )


def _run(ctx):
    from pcp_sparseloco.rounds import run  # here: keeps `pcp --help` from loading the engine

    return run(ctx)


def _worker_round(session, assignment):
    from pcp_core.engine import steps_from_global  # the round: steps from the global model

    return steps_from_global(session, assignment)


@hookimpl
def pcp_register_algorithms(register) -> None:
    register(
        Algorithm(
            name="sparseloco",
            run=_run,
            worker_round=_worker_round,
            resumable=True,
            settings=SparseLocoSettings,
            description="SparseLoCo: DiLoCo's rounds as sparse 2-bit messages, ~100x fewer bytes",
        )
    )


@hookimpl
def pcp_register_codecs(register) -> None:
    from pcp_sparseloco.codec import SPARSE2

    register(SPARSE2)
