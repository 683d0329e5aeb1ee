"""The supervisor: a light parent that restarts its worker process after a crash, and
keeps it trying while its shepherd is out of reach.

Two kinds of exit are retried, differently:

- A crash (exit 1): restarts back off exponentially (1 s, 2 s, 4 s … up to 30 s).
  `max_restarts` crashes in a row are a crash loop: reported once, and supervision ends.
  A worker that joined its shepherd since it was started, or ran for over `STABLE_S`,
  starts the count afresh: it was working, so the next crash is no loop.
- A lost or unreachable shepherd (exit 4, `exit_codes.UNREACHABLE`: a shepherd that is
  restarting, a network that is down): no crash at all. Retried with the same capped
  backoff for as long as the run may come back: until `give_up_after_s` have passed
  since the worker last joined (or was first started).

A clean exit, a configuration error (no device, missing driver, bad input), a refusal (a
wrong secret or version), a failed final checkpoint or Ctrl-C ends supervision:
restarting cannot fix those (`pcp_core.exit_codes`).

The worker never outlives its supervisor: a supervisor that is a process of its own
(`pcp worker`, see `serve`) passes SIGTERM, SIGINT and SIGHUP on to it, and on Linux the
kernel kills the worker when the supervisor dies, SIGKILL included: the worker arms
that itself at start (`die_with_parent`, told the parent's pid in PARENT_ENV), so no
code runs between fork and exec in a shepherd full of threads.
"""

import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

from pcp_core import exit_codes

log = structlog.get_logger(__name__)

STABLE_S = 60.0
# How long a worker keeps trying to reach its shepherd: long enough for a shepherd's
# restart or a network's outage, not so long that a worker of a finished run (which it
# cannot tell from a restarting one) lingers for a day.
GIVE_UP_AFTER_S = 3600.0
GRACE_S = 10.0  # how long a signalled worker may take to exit before it is killed
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_ENV = "PCP_SUPERVISOR_PID"  # the worker dies with this process
JOINED_ENV = "PCP_JOINED_FILE"  # the worker writes to this file once it has joined


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


def die_with_parent() -> None:
    """In a supervised worker: have the kernel SIGKILL this process when the supervisor's
    thread that started it ends (Linux's parent-death signal), and end at once if the
    supervisor is already gone. Does nothing unsupervised or where there is no prctl."""
    parent = os.environ.get(PARENT_ENV)
    prctl = _prctl()
    if parent is None or prctl is None:
        return
    prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != int(parent):  # the supervisor died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


def mark_joined() -> None:
    """In a supervised worker: tell the supervisor this worker joined its shepherd."""
    path = os.environ.get(JOINED_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "ab") as marker:
            marker.write(b"j")


class Supervisor:
    """Runs `command`, restarting it after a crash (up to `max_restarts` in a row) and
    while its shepherd is out of reach (for up to `give_up_after_s`)."""

    def __init__(
        self,
        command: Sequence[str],
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        max_restarts: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        give_up_after_s: float = GIVE_UP_AFTER_S,
    ) -> None:
        self.command = list(command)
        self.env = env
        self.log_path = log_path
        self.max_restarts = max_restarts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.give_up_after_s = give_up_after_s
        self.restarts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.signalled: int | None = None  # the signal that stopped `serve`
        self._own_group = False
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def _spawn(self, joined: Path) -> subprocess.Popen[bytes]:
        joined.write_bytes(b"")
        env = {**(os.environ if self.env is None else self.env)}
        env |= {PARENT_ENV: str(os.getpid()), JOINED_ENV: str(joined)}
        output = self.log_path.open("ab") if self.log_path else None
        try:
            return subprocess.Popen(
                self.command,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
                # under `serve`, signals reach the worker through this process only, once
                process_group=0 if self._own_group else None,
            )
        finally:
            if output:
                output.close()

    def run(self) -> int:
        """Supervise until a final exit; returns the worker's last exit code."""
        descriptor, name = tempfile.mkstemp(prefix="pcp-joined-")
        os.close(descriptor)
        joined = Path(name)
        try:
            return self._supervise(joined)
        finally:
            joined.unlink(missing_ok=True)

    def _supervise(self, joined: Path) -> int:
        delay, in_a_row = self.backoff_s, 0
        reachable_at = time.monotonic()  # the last join (or the start)
        while True:
            with self._lock:
                if self._stopping.is_set():
                    return exit_codes.INTERRUPTED
                started = time.monotonic()
                self.process = self._spawn(joined)
            code = self.process.wait()
            if code in exit_codes.FINAL or self._stopping.is_set():
                return code
            if joined.stat().st_size or time.monotonic() - started > STABLE_S:
                delay, in_a_row = self.backoff_s, 0  # it was working: no loop, no backoff
            if joined.stat().st_size:
                reachable_at = time.monotonic()
            if code == exit_codes.UNREACHABLE:
                unreachable_s = time.monotonic() - reachable_at
                if unreachable_s > self.give_up_after_s:
                    log.error(
                        "the shepherd stayed out of reach; giving up",
                        for_s=round(unreachable_s),
                        give_up_after_s=self.give_up_after_s,
                    )
                    return code
                log.warning(
                    "the shepherd is out of reach; trying again",
                    in_s=delay,
                    # restarting, a network down, or a run that ended: it cannot tell
                    giving_up_in_s=round(self.give_up_after_s - unreachable_s),
                )
            elif in_a_row >= self.max_restarts:
                log.error(
                    "worker is in a crash loop; giving up",
                    code=code,
                    crashes_in_a_row=in_a_row + 1,
                    log=str(self.log_path) if self.log_path else "above",
                )
                return code
            else:
                in_a_row += 1
                log.warning(
                    "worker crashed; restarting", code=code, restart=self.restarts + 1, in_s=delay
                )
            self.restarts += 1
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
