"""The supervisor: a light parent that restarts its worker process after a crash.

Restarts back off exponentially (1 s, 2 s, 4 s … up to 30 s). A worker that ran for
over `STABLE_S` before it crashed (it lost its shepherd after an hour of rounds, say)
starts the count and the backoff afresh; `max_restarts` crashes in a row, each soon
after its start, are a crash loop: reported once, and supervision ends. A clean exit,
a configuration error (no device, missing driver, bad input), a refusal (a wrong secret
or version) or Ctrl-C ends supervision too: restarting cannot fix those
(`pcp_core.exit_codes`).

The worker never outlives its supervisor: a supervisor that is a process of its own
(`pcp worker`, see `serve`) passes SIGTERM, SIGINT and SIGHUP on to it, and on Linux the
kernel kills the worker when the supervisor dies, SIGKILL included.
"""

import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

from pcp_core import exit_codes

log = structlog.get_logger(__name__)

STABLE_S = 60.0
GRACE_S = 10.0  # how long a signalled worker may take to exit before it is killed
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _prctl() -> Any:
    """libc's prctl, or None off Linux or where it cannot be found."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def dies_with_this_thread() -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel SIGKILL the child when the thread that starts
    it ends (Linux's parent-death signal: it follows the thread, not the process, so
    start the child from a thread that outlives it). None where there is no prctl.

    It runs between fork and exec, so it only calls what was looked up beforehand.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent, kill = os.getpid(), int(signal.SIGKILL)

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), kill)

    return arm


class Supervisor:
    """Runs `command` and restarts it after a crash, up to `max_restarts` times in a row."""

    def __init__(
        self,
        command: Sequence[str],
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        max_restarts: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.command = list(command)
        self.env = env
        self.log_path = log_path
        self.max_restarts = max_restarts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.restarts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.signalled: int | None = None  # the signal that stopped `serve`
        self._own_group = False
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def _spawn(self) -> subprocess.Popen[bytes]:
        output = self.log_path.open("ab") if self.log_path else None
        try:
            return subprocess.Popen(
                self.command,
                env=self.env,
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
                preexec_fn=dies_with_this_thread(),
                # under `serve`, signals reach the worker through this process only, once
                process_group=0 if self._own_group else None,
            )
        finally:
            if output:
                output.close()

    def run(self) -> int:
        """Supervise until a final exit; returns the worker's last exit code."""
        delay, in_a_row = self.backoff_s, 0
        while True:
            with self._lock:
                if self._stopping.is_set():
                    return exit_codes.INTERRUPTED
                started = time.monotonic()
                self.process = self._spawn()
            code = self.process.wait()
            if code in exit_codes.FINAL or self._stopping.is_set():
                return code
            if time.monotonic() - started > STABLE_S:
                delay, in_a_row = self.backoff_s, 0
            if in_a_row >= self.max_restarts:
                log.error(
                    "worker is in a crash loop; giving up",
                    code=code,
                    crashes_in_a_row=in_a_row + 1,
                    log=str(self.log_path) if self.log_path else "above",
                )
                return code
            in_a_row += 1
            self.restarts += 1
            log.warning("worker crashed; restarting", code=code, restart=self.restarts, in_s=delay)
            if self._stopping.wait(delay):
                return exit_codes.INTERRUPTED
            delay = min(delay * 2, self.max_backoff_s)

    def serve(self, grace_s: float = GRACE_S) -> int:
        """`run`, in the main thread of a process that only supervises (`pcp worker`).

        SIGTERM, SIGINT and SIGHUP stop supervision and end the worker: the signal is
        passed on to it, and SIGKILL follows after `grace_s`. The worker runs in a
        process group of its own, so a terminal's Ctrl-C reaches it once, from here.
        Returns the worker's exit code, or 128 + the signal's number once signalled
        (130 for Ctrl-C, 143 for SIGTERM). A signal this process ignores (under
        `nohup`, say) stays ignored.
        """

        def stop(signum: int) -> None:
            log.info("stopping the worker", signal=signal.Signals(signum).name)
            self.stop(grace_s, signum)

        def forward(signum: int, frame: FrameType | None) -> None:
            # In a thread: the main thread may be holding the lock, or writing to stderr.
            self.signalled = signum
            threading.Thread(target=stop, args=(signum,), name="pcp-supervisor-stop").start()

        previous = {
            number: signal.signal(number, forward)
            for number in FORWARDED
            if signal.getsignal(number) is not signal.SIG_IGN
        }
        self._own_group = True
        try:
            code = self.run()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
        return 128 + self.signalled if self.signalled else code

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="pcp-supervisor", daemon=True)
        thread.start()
        return thread

    def stop(self, grace_s: float = 5.0, signum: int = signal.SIGTERM) -> None:
        """Stop supervising and end the worker: `signum`, then SIGKILL after `grace_s`."""
        with self._lock:
            self._stopping.set()
            process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signum)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
