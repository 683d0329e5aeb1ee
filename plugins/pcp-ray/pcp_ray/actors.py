"""The actor that runs one PCP process, `pcp shepherd` or `pcp worker`, on a Ray node.

The process is the actor's child, with its output appended to a log in the run
directory. It dies with the actor (Linux's parent-death signal): when Ray kills the
actor, or the actor's process dies, the child gets SIGTERM instead of living on out of
Ray's sight; the restarted actor starts a new one, and the worker rejoins the run.
"""

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import ray

from pcp_ray.launcher import SHEPHERD_ADDRESS

PR_SET_PDEATHSIG = 1  # prctl option: the signal this process gets when its parent dies


def resume_or_start(shepherd_dir: Path) -> list[str]:
    """The shepherd's run options: `--resume` from the run's last checkpoint when there
    is one (a restarted driver or actor), else a fresh run there; the same rule as the
    core's scripts (`pcp_core.launch.script.resume_or_start`)."""
    if any(shepherd_dir.glob("checkpoint*")):
        return ["--resume", str(shepherd_dir)]
    return ["--out", str(shepherd_dir), "--overwrite"]


def dies_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGTERM when its parent dies (Linux);
    None elsewhere, where a child may outlive a killed actor."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()

    def set_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return set_signal


@ray.remote
class PcpProcess:
    """Runs `command` from the moment the actor starts, its output appended to `log`:
    SHEPHERD_ADDRESS in it replaced by `shepherd`, and the shepherd's run options added
    if `shepherd_dir` is given.

    The process starts in the constructor, not in a task, because Ray runs the
    constructor again when it restarts the actor. It does not always retry a task that
    was running when the actor died: in CI, a killed worker's restarted actor never got
    its task back, and the worker never rejoined.
    """

    def __init__(
        self,
        command: list[str],
        log: str,
        shepherd: str | None = None,
        shepherd_dir: str | None = None,
    ) -> None:
        command = [word.replace(SHEPHERD_ADDRESS, shepherd or "") for word in command]
        if shepherd_dir is not None:
            command += resume_or_start(Path(shepherd_dir))
        log_path = Path(log)
        with log_path.open("ab") as out:
            self.child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=log_path.parent,
                preexec_fn=dies_with_parent(),
            )

    def node_address(self) -> str:
        """The address of this actor's node, as the other nodes reach it."""
        return ray.util.get_node_ip_address()

    def exit_status(self) -> int | None:
        """The command's exit status; None while it runs."""
        return self.child.poll()
