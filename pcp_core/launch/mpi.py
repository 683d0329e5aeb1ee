"""The MPI launcher: the shepherd here, the workers by `mpirun -n WORKERS`, each taking
its device from its rank on the node (`pcp_core.launch.ranks`).

A lab that already has an MPI launch line needs no launcher at all: `mpirun -n 4 pcp
worker --connect HOST:PORT --token-file FILE` works, as each worker reads its rank from
the MPI environment. `pcp launch mpi` writes and runs a script doing both halves.
"""

import shlex

from pcp_core.launch import script
from pcp_core.launchers import Launcher, LaunchError, LaunchPlan, LaunchRequest, shell_join

SCRIPT = "pcp-mpi.sh"

OPTIONS = {
    "hostfile": "Hosts to start the workers on (mpirun --hostfile); default: this machine.",
    "mpirun-args": "More mpirun flags, as one shell-quoted string (e.g. '--map-by ppr:1:gpu').",
    "shepherd-host": "Address workers use to reach the shepherd (default: this machine's "
    "hostname).",
}


class MpiLauncher(Launcher):
    name = "mpi"
    description = "the shepherd here, the workers by mpirun (Open MPI, MPICH)"
    options = OPTIONS
    tool = "mpirun"

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        try:
            extra = shlex.split(request.options.get("mpirun-args", ""))
        except ValueError as error:
            raise LaunchError(f"mpi option mpirun-args: {error}") from None
        hostfile = request.options.get("hostfile")
        mpirun = ["mpirun", "-n", str(request.workers)]
        mpirun += ["--hostfile", hostfile] if hostfile else []
        text = (
            "#!/bin/bash\n"
            "# Written by `pcp launch mpi`. Run it again to resume the run from its last\n"
            "# checkpoint; the secret stays in the token file.\n"
            + script.header(request)
            + script.shepherd_host(request)
            + script.start_shepherd(request)
            + 'echo "pcp launch: shepherd and workers running; logs: shepherd.log, workers.log"\n'
            + shell_join([*mpirun, *extra, *request.worker_command(f"$host:{request.port}")])
            + " >> workers.log 2>&1 &\nworkers=$!\n"
            + script.wait_for_run()
        )
        return LaunchPlan(
            files={SCRIPT: text},
            submit=(f"./{SCRIPT}",),
            executable=SCRIPT,
            next_steps=f"resume after a stop: {request.run_dir / SCRIPT}",
        )


MPI = MpiLauncher()
