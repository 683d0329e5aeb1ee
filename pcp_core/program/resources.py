"""Whether a run fits the machine it starts on, checked before anything is compiled.

The training footprint (`pcp_core.program.footprint`, an estimate) counts against this machine's
memory for every training process here whose device is this machine's memory (a
runtime with `host_memory`: IREE on the CPU); every local process also
costs PROCESS_BYTES of its own (Python, the runtimes), and the shepherd of a
distributed run SHEPHERD_COPIES copies of the model (`pcp_core.shepherd.aggregation`,
`pcp_core.shepherd.step_guard`). A device's own memory (a GPU's) is not checked here.
"""

import os

from pcp_core.backends import Backend
from pcp_core.config import ConfigError
from pcp_core.program.footprint import Footprint, human_bytes

PROCESS_BYTES = 256 * 2**20
SHEPHERD_COPIES = 9


def machine_memory() -> int | None:
    """This machine's physical memory in bytes, or None where it cannot be told."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def trains_in_host_memory(backend: Backend) -> bool:
    return backend.runtime.host_memory


def require_memory(
    footprint: Footprint, trainers: list[Backend], shepherd: bool, evaluation_bytes: int
) -> None:
    """ConfigError, one line, if the run will not fit this machine's memory: `trainers`
    are the training processes started here, `shepherd` whether this process also
    holds a distributed run's model copies."""
    total = machine_memory()
    if total is None:
        return
    on_host = sum(trains_in_host_memory(backend) for backend in trainers)
    needed = on_host * footprint.total_bytes + len(trainers) * PROCESS_BYTES
    needed += evaluation_bytes + (SHEPHERD_COPIES * footprint.weight_bytes if shepherd else 0)
    if needed > total:
        processes = f"{len(trainers)} training processes" if len(trainers) > 1 else "it"
        raise ConfigError(
            f"this run needs about {human_bytes(needed)} of memory ({processes}: "
            f"{footprint.describe_memory()} each; validation batches "
            f"{human_bytes(evaluation_bytes)}), more than this machine's {human_bytes(total)}; "
            "lower --batch-size, --eval-batches, the model's size or --workers, or start "
            "workers on other machines with `pcp worker`"
        )
