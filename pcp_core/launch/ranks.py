"""A worker's place in a job that an engine started: its rank and its rank on the node,
read from the variables Open MPI, PMIx, MPICH's Hydra and Slurm set.

A lab's `mpirun -n 4 pcp worker ...` or `srun pcp worker ...` then needs nothing per
worker: each process picks the device of its rank on the node, and logs its rank.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass

# (rank, rank on the node, size), first match wins: Open MPI, then PMIx and PMI
# (MPICH, Intel MPI), then Slurm's srun
SOURCES = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMIX_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
    ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
)


@dataclass(frozen=True)
class Rank:
    rank: int
    local_rank: int | None  # None where the engine does not say
    size: int | None
    source: str  # the variable the rank came from


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def job_rank(environ: Mapping[str, str] = os.environ) -> Rank | None:
    """This process's rank in its MPI or Slurm job, or None outside one."""
    for rank_name, local_name, size_name in SOURCES:
        rank = _int(environ, rank_name)
        if rank is not None:
            return Rank(rank, _int(environ, local_name), _int(environ, size_name), rank_name)
    return None


def device_for(rank: Rank | None, device_count: int) -> int | None:
    """The device a worker of `rank` takes when none is named: its rank on the node,
    modulo the devices there, on a machine with several; None otherwise."""
    if rank is None or rank.local_rank is None or device_count <= 1:
        return None
    return rank.local_rank % device_count
