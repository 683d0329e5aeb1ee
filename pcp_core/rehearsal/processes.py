"""The processes of a rehearsed run (`pcp_core.rehearsal.harness`): each started in its
node's namespace, in a session of its own, logging to a file; and all stopped by process
group, so a supervised worker's children go with it, also on an exception.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pcp_core.rehearsal.links import Network


@dataclass
class Processes:
    """The processes a run started, by node name, with their open log files."""

    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: list[IO[bytes]] = field(default_factory=list)

    def exit_codes(self) -> dict[str, int | None]:
        return {name: process.poll() for name, process in self.running.items()}


def start_process(
    processes: Processes,
    network: Network,
    name: str,
    argv: Sequence[str],
    run_dir: Path,
    preexec: Callable[[], None] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` in node `name`'s namespace, in a session of its own, logging to a
    file; `preexec` runs in the new process first (to join a CPU quota's cgroup)."""
    log_file = (run_dir / "logs" / f"{name}.log").open("wb")
    processes.logs.append(log_file)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = network.popen(
        name,
        list(argv),
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        preexec_fn=preexec,
    )
    processes.running[name] = process
    return process


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    """Send `signum` to the process's whole session (a supervised worker has children)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def stop_all(processes: Processes, grace_s: float = 5.0) -> None:
    """SIGTERM every process group still running, SIGKILL what is left after `grace_s`."""
    alive = [p for p in processes.running.values() if p.poll() is None]
    for process in alive:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
    for process in processes.running.values():
        _signal_group(process, signal.SIGKILL)  # also children left by an exited leader
        if process.poll() is None:
            process.wait()
    for log_file in processes.logs:
        log_file.close()


def wait_workers(processes: Processes, timeout_s: float) -> None:
    """Give the workers `timeout_s` to leave by themselves once the shepherd is done."""
    deadline = time.monotonic() + timeout_s
    for name, process in processes.running.items():
        if name == "shepherd":
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
