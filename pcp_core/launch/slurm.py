"""The Slurm launcher: one sbatch script that runs the shepherd on the job's first node
and the workers as one `srun` step, one task each (one per GPU with `gpus-per-task`).

`pcp launch slurm` submits it with `sbatch`; `scancel` stops every process of the job
(Slurm signals them all); `scontrol requeue`, or `sbatch` of the same script again,
resumes the run from its last checkpoint, as the script picks `--resume` when one exists.
"""

from pcp_core.launch import script
from pcp_core.launchers import Launcher, LaunchError, LaunchPlan, LaunchRequest, shell_join

SCRIPT = "pcp.sbatch"

# --option KEY=VALUE -> the sbatch directive it becomes
DIRECTIVES = {
    "partition": "Slurm partition (sbatch --partition).",
    "account": "Account charged (sbatch --account).",
    "time": "Time limit, e.g. 2:00:00 (sbatch --time).",
    "nodes": "Nodes for the job; the shepherd runs on the first (sbatch --nodes).",
    "cpus-per-task": "CPU cores per worker (sbatch --cpus-per-task).",
    "gpus-per-task": "GPUs per worker (sbatch --gpus-per-task); with --backend xla and "
    "--devices all, one worker drives them all.",
}
OPTIONS = {
    **DIRECTIVES,
    "shepherd-host": "Address workers use to reach the shepherd (default: the first node's "
    "hostname).",
}


class SlurmLauncher(Launcher):
    name = "slurm"
    description = "an sbatch job: the shepherd on the first node, the workers by srun"
    options = OPTIONS
    tool = "sbatch"

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        for key in ("nodes", "cpus-per-task", "gpus-per-task"):
            value = request.options.get(key)
            if value is not None and not (value.isdigit() and int(value) > 0):
                raise LaunchError(f"slurm option {key} must be a positive whole number: {value!r}")
        run = request.run_dir
        directives = [
            f"--job-name=pcp-{run.name}",
            f"--output={run / 'slurm-%j.out'}",
            f"--ntasks={request.workers}",
            "--requeue",
            "--open-mode=append",
            *(f"--{key}={request.options[key]}" for key in DIRECTIVES if key in request.options),
        ]
        step = ["srun", f"--ntasks={request.workers}", "--kill-on-bad-exit=0"]
        step += [f"--output={run / 'worker-%t.log'}"]
        step += [
            f"--{k}={request.options[k]}"
            for k in ("gpus-per-task", "cpus-per-task")
            if k in request.options
        ]
        text = (
            "#!/bin/bash\n"
            + "".join(f"#SBATCH {shell_join([d])}\n" for d in directives)
            + "# Written by `pcp launch slurm`. Resubmit with `sbatch` to resume the run from\n"
            "# its last checkpoint; the secret stays in the token file.\n"
            + script.header(request)
            + script.shepherd_host(request)
            + script.start_shepherd(request)
            + shell_join([*step, *request.worker_command(f"$host:{request.port}")])
            + " &\nworkers=$!\n"
            + script.wait_for_run()
        )
        return LaunchPlan(
            files={SCRIPT: text},
            submit=("sbatch", "--parsable", SCRIPT),
            executable=SCRIPT,
            next_steps=(
                f"watch: squeue --me; tail -f {run / 'shepherd.log'}\n"
                "stop:  scancel JOBID (the job id sbatch printed)\n"
                f"resume after a stop: sbatch {run / SCRIPT}"
            ),
        )


SLURM = SlurmLauncher()
