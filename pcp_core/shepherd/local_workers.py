"""The workers a one-command run (`pcp train --algorithm diloco`) starts on this
machine: each a `pcp worker` under its own supervisor, all ended with the run."""

import contextlib
import subprocess
import time
from pathlib import Path

from pcp_core.worker.supervisor import Supervisor


class LocalWorkers:
    """N supervised worker processes on this machine, all ended on exit (Ctrl-C too)."""

    def __init__(self, commands: list[list[str]], env: dict[str, str], log_dir: Path) -> None:
        self.supervisors = [
            Supervisor(cmd, env=env, log_path=log_dir / f"worker-{i}.log")
            for i, cmd in enumerate(commands)
        ]

    def __enter__(self) -> "LocalWorkers":
        self.threads = [supervisor.start() for supervisor in self.supervisors]
        return self

    def any_running(self) -> bool:
        """False once every worker has exited for good (its supervisor gave up or it ended)."""
        return any(thread.is_alive() for thread in self.threads)

    def __exit__(self, error_type: type[BaseException] | None, *rest: object) -> None:
        deadline = time.monotonic() + (10.0 if error_type is None else 0.0)
        for supervisor in self.supervisors:
            process = supervisor.process
            if error_type is None and process is not None and process.poll() is None:
                # workers told to stop exit by themselves; give them a moment
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(max(deadline - time.monotonic(), 0.1))
            supervisor.stop()
