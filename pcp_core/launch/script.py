"""The shell a launcher's script runs: start (or resume) the shepherd, start the
workers, wait, pass signals on. Shared by the Slurm and MPI launchers (and the
Kubernetes shepherd's start)."""

from pathlib import Path

from pcp_core.launchers import LaunchRequest, shell_join


def header(request: LaunchRequest) -> str:
    """The lines every script starts with: strict mode, the run directory."""
    return f"set -u\ncd {shell_join([str(request.run_dir)])}\n"


def shepherd_host(request: LaunchRequest) -> str:
    """Set `$host`, the address workers reach the shepherd at: the `shepherd-host`
    option, else the name of the machine the script runs on."""
    host = request.options.get("shepherd-host")
    return f"host={shell_join([host]) if host else '$(hostname)'}\n"


def resume_or_start(shepherd_dir: Path) -> str:
    """Set `start`, the shepherd's run options: `--resume` from the run's last checkpoint
    when there is one (a requeued or resubmitted job, a restarted pod), else a fresh run
    in `shepherd_dir` (replacing one that never reached a checkpoint)."""
    out = shell_join([str(shepherd_dir)])
    return (
        f"if compgen -G {out}'/checkpoint*' > /dev/null; then\n"
        f'    start=(--resume {out}); echo "pcp launch: resuming {shepherd_dir}"\n'
        "else\n"
        f"    start=(--out {out} --overwrite)\n"
        "fi\n"
    )


def start_shepherd(request: LaunchRequest) -> str:
    """Start `pcp shepherd` in the background as `$shepherd`, resumed or fresh
    (`resume_or_start`), its output in RUN_DIR/shepherd.log."""
    return (
        resume_or_start(request.shepherd_dir)
        + f'{shell_join(request.shepherd_command())} "${{start[@]}}" >> shepherd.log 2>&1 &\n'
        + "shepherd=$!\n"
    )


# after the shepherd ends, its workers have this long to take its stop and exit;
# a shepherd that crashed tells them nothing, and they would keep reconnecting
WORKERS_GRACE_S = 30


def wait_for_run() -> str:
    """Wait for the shepherd (`$shepherd`), then for the workers (`$workers`), stopped
    after a grace period if still running; TERM or INT is passed to both. The script
    exits with the shepherd's status and leaves no process of its own behind (a
    background timer would outlive it, out of the engine's sight)."""
    return (
        "trap 'kill -TERM $shepherd $workers 2> /dev/null' TERM INT\n"
        "wait $shepherd; status=$?\n"
        f"for _ in $(seq {WORKERS_GRACE_S}); do\n"
        "    kill -0 $workers 2> /dev/null || break; sleep 1\n"
        "done\n"
        "kill -TERM $workers 2> /dev/null; wait $workers 2> /dev/null\n"
        'echo "pcp launch: the shepherd exited with status $status"\n'
        "exit $status\n"
    )
