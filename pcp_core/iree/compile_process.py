"""Running `iree-compile` as a child process, restarted when it hangs.

IREE 3.13's compiler now and then deadlocks: its threads all wait on each other at 0%
CPU, forever (about one CUDA compile in ten on a 2-core machine here, in `pcp compile`,
the tests and the benchmarks alike). A run must not hang on that, so the compiler runs
as a child whose CPU time this process reads from /proc, its own and that of the
processes it starts (the llvm-cpu target links with `iree-lld`); a compiler that has
used less than `MIN_PROGRESS_SECONDS` of CPU in `STALL_SECONDS` is killed with
everything it started, and the compile starts again, at most `ATTEMPTS` times. A
compiler at work keeps a core busy. Where there is no /proc (macOS, Windows) the child
is simply waited for.

A compiler runs in a session of its own, so a terminal's Ctrl-C does not reach it: a
compile the main thread waits for is killed as the interrupt unwinds, and one that
another thread started (a shepherd compiling for a joining worker) is ended by
`stop_compilers`, or when this process exits, not left running as an orphan.
"""

import atexit
import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

STALL_SECONDS = 120.0  # less than MIN_PROGRESS_SECONDS of CPU in this long: deadlocked
MIN_PROGRESS_SECONDS = 0.5
POLL_SECONDS = 2.0
ATTEMPTS = 3


class CompilerFailed(RuntimeError):
    """The compiler exited with an error; its message holds the compiler's stderr."""


class CompilerHung(RuntimeError):
    """The compiler deadlocked on every attempt."""


class CompilerStopped(CompilerFailed):
    """The compiler was stopped from outside (`stop_compilers`): its process is ending."""


_running: dict[int, tuple[int, subprocess.Popen]] = {}  # by pid: (starting thread, child)
_stopped: set[int] = set()  # pids `stop_compilers` killed
_running_lock = threading.Lock()


def stop_compilers(threads: set[int] | None = None) -> None:
    """Kill the compilers running for `threads` (their `threading.get_ident()`; all of
    them by default), each with the processes it started; their callers get
    `CompilerStopped`."""
    with _running_lock:
        chosen = [
            child for thread, child in _running.values() if threads is None or thread in threads
        ]
        _stopped.update(child.pid for child in chosen)
    for child in chosen:
        kill(child)


atexit.register(stop_compilers)  # a compile on a daemon thread must not outlive us


def iree_compile_command(output: Path, target: str, flags: list[str]) -> list[str]:
    """The `iree-compile` command line for StableHLO on its standard input, as IREE's
    own Python API builds it (it finds the tool and, for llvm-cpu, the linker). Read
    from a pipe, not a named file, the program's source locations name no temporary
    path, so the same program compiles to the same bytes."""
    from iree.compiler.tools.core import CompilerOptions, build_compile_command_line
    from iree.compiler.tools.debugging import TempFileSaver

    options = CompilerOptions(
        target_backends=[target], input_type="stablehlo", output_file=str(output), extra_args=flags
    )
    with TempFileSaver.implicit() as saver:
        return build_compile_command_line("-", saver, options)


def compile_stablehlo(stablehlo: str, target: str, flags: list[str]) -> bytes:
    """`iree-compile`'s output for `stablehlo` on `target` with `flags`, restarted when
    it deadlocks: a module, or text for a `--compile-to=PHASE` flag."""
    with tempfile.TemporaryDirectory(prefix="pcp-compile-") as scratch:
        source, output = Path(scratch) / "program.mlir", Path(scratch) / "program.out"
        source.write_text(stablehlo, encoding="utf-8")
        return run_compiler(iree_compile_command(output, target, flags), source, output)


def _process_cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # fields after the command name (which may hold spaces): utime is the 12th, then
    # stime, cutime, cstime (children already reaped)
    fields = stat.rpartition(")")[2].split()
    return sum(int(tick) for tick in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):  # a thread or process that just ended
            found += [int(child) for child in children.read_text().split()]
    return found


def cpu_seconds(pid: int) -> float | None:
    """CPU time `pid` and the processes it started have used; None where /proc cannot
    say."""
    own = _process_cpu_seconds(pid)
    if own is None:
        return None
    pending = _children(pid)
    while pending:
        child = pending.pop()
        own += _process_cpu_seconds(child) or 0.0
        pending += _children(child)
    return own


def finished_within(child: subprocess.Popen, seconds: float) -> bool:
    try:
        child.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def kill(child: subprocess.Popen) -> None:
    """Kill `child` and every process in its group (POSIX; elsewhere `child` alone)."""
    if hasattr(os, "killpg"):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    else:
        child.kill()
    child.wait()


def run_once(command: list[str], source: Path, stall_seconds: float) -> tuple[int, str] | None:
    """Run `command` on `source` to its end: (exit status, stderr); None if it hung
    and was killed."""
    with tempfile.TemporaryFile() as stderr, source.open("rb") as stdin:
        # its own process group, so that a kill takes the processes it started too
        child = subprocess.Popen(
            command,
            stdin=stdin,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        with _running_lock:
            _running[child.pid] = (threading.get_ident(), child)
        last_cpu, last_progress = None, time.monotonic()
        try:
            while not finished_within(child, POLL_SECONDS):
                cpu = cpu_seconds(child.pid)
                if cpu is None or last_cpu is None or cpu - last_cpu >= MIN_PROGRESS_SECONDS:
                    last_cpu, last_progress = cpu, time.monotonic()
                elif time.monotonic() - last_progress > stall_seconds:
                    kill(child)
                    return None
        finally:
            if child.poll() is None:  # interrupted: take the compiler down with us
                kill(child)
            with _running_lock:
                _running.pop(child.pid, None)
                if child.pid in _stopped:
                    _stopped.discard(child.pid)
                    raise CompilerStopped("the compiler was stopped: this process is ending")
        stderr.seek(0)
        return child.returncode, stderr.read().decode(errors="replace")


def run_compiler(
    command: list[str], source: Path, output: Path, stall_seconds: float = STALL_SECONDS
) -> bytes:
    """Run a compiler `command` that reads `source` on its standard input and writes
    `output`, restarting it when it deadlocks."""
    for attempt in range(1, ATTEMPTS + 1):
        result = run_once(command, source, stall_seconds)
        if result is None:
            log.warning(
                "the IREE compiler stopped using CPU (a known IREE deadlock); restarting it",
                stalled_seconds=stall_seconds,
                attempt=attempt,
                attempts=ATTEMPTS,
            )
            continue
        status, stderr = result
        if status != 0:
            raise CompilerFailed(stderr or f"exit status {status}")
        if stderr.strip():
            log.info("the IREE compiler said", message=stderr.strip()[-2000:])
        return output.read_bytes()
    raise CompilerHung(
        f"the IREE compiler deadlocked {ATTEMPTS} times in a row"
        f" (under {MIN_PROGRESS_SECONDS} s of CPU in {stall_seconds:.0f} s, each time)"
    )
