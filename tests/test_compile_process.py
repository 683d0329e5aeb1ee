"""The IREE compiler runs as a child that is restarted when it deadlocks (IREE 3.13
does, now and then) and whose errors reach the user."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from pcp_core.iree import compile_process
from pcp_core.iree.compile_process import (
    CompilerFailed,
    CompilerHung,
    CompilerStopped,
    run_compiler,
    stop_compilers,
)

# A stand-in for a compiler that deadlocks on its first `hangs` runs: it blocks at 0%
# CPU, as IREE's threads do, then writes its output.
FLAKY_COMPILER = """
import sys, time
from pathlib import Path
runs, output, hangs = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
runs.write_text(str(int(runs.read_text() or 0) + 1) if runs.exists() else "1")
if int(runs.read_text()) <= hangs:
    time.sleep(3600)
output.write_bytes(b"module")
"""


def flaky_compiler(tmp_path: Path, hangs: int) -> tuple[list[str], Path, Path]:
    script, runs, output = tmp_path / "compiler.py", tmp_path / "runs", tmp_path / "out"
    script.write_text(FLAKY_COMPILER)
    return [sys.executable, str(script), str(runs), str(output), str(hangs)], runs, output


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "program.mlir"
    path.write_text("module {}")
    return path


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_process, "POLL_SECONDS", 0.2)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the watchdog reads /proc")
def test_a_deadlocked_compiler_is_restarted(tmp_path: Path, source: Path) -> None:
    command, runs, output = flaky_compiler(tmp_path, hangs=2)
    with capture_logs() as events:
        assert run_compiler(command, source, output, stall_seconds=1.5) == b"module"
    assert runs.read_text() == "3"
    restarts = [e for e in events if "stopped using CPU" in e["event"]]
    assert [e["attempt"] for e in restarts] == [1, 2]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the watchdog reads /proc")
def test_a_compiler_that_always_deadlocks_is_an_error(tmp_path: Path, source: Path) -> None:
    command, runs, output = flaky_compiler(tmp_path, hangs=99)
    with pytest.raises(CompilerHung, match="deadlocked 3 times"):
        run_compiler(command, source, output, stall_seconds=1.5)
    assert runs.read_text() == "3"


def test_a_busy_compiler_is_left_alone(tmp_path: Path, source: Path) -> None:
    """Seconds of CPU work with no output is progress, not a hang."""
    output = tmp_path / "out"
    busy = (
        "import sys, time, pathlib\n"
        "end = time.time() + 3\n"
        "while time.time() < end: pass\n"
        "pathlib.Path(sys.argv[1]).write_bytes(b'done')"
    )
    command = [sys.executable, "-c", busy, str(output)]
    assert run_compiler(command, source, output, stall_seconds=1.5) == b"done"


def test_a_compiler_error_keeps_its_message(tmp_path: Path, source: Path) -> None:
    failing = "import sys; sys.stderr.write('prog.mlir:3:1: error: unknown op'); sys.exit(1)"
    with pytest.raises(CompilerFailed, match="error: unknown op"):
        run_compiler([sys.executable, "-c", failing], source, tmp_path / "out")


def test_bad_stablehlo_is_a_compile_error_naming_the_backend() -> None:
    import pcp_cpu

    from pcp_core.backends import CompileError
    from pcp_core.iree.compiler import compile_program

    with pytest.raises(CompileError, match=r"failed to compile for cpu .*error:"):
        compile_program("func.func @main() { %0 = nonsense.op }", pcp_cpu.CPU, "x86-64")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the watchdog reads /proc")
def test_work_in_a_process_the_compiler_started_is_progress(tmp_path: Path, source: Path) -> None:
    """The llvm-cpu compiler waits, idle, while the iree-lld it started links."""
    output = tmp_path / "out"
    linker = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"
    compiler = (
        "import pathlib, subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', {linker!r}])\n"
        "pathlib.Path(sys.argv[1]).write_bytes(b'linked')"
    )
    command = [sys.executable, "-c", compiler, str(output)]
    assert run_compiler(command, source, output, stall_seconds=1.5) == b"linked"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the watchdog reads /proc")
def test_a_hung_compiler_is_killed_with_the_processes_it_started(
    tmp_path: Path, source: Path
) -> None:
    started = tmp_path / "started"
    compiler = (
        "import pathlib, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])\n"
        "with open(sys.argv[1], 'a') as f: f.write(f'{child.pid}\\n')\n"
        "time.sleep(3600)"
    )
    with pytest.raises(CompilerHung):
        run_compiler([sys.executable, "-c", compiler, str(started)], source, tmp_path / "out", 1.5)
    pids = [int(pid) for pid in started.read_text().split()]
    assert len(pids) == 3
    for pid in pids:
        assert ended(pid), f"process {pid} is still running"


# A compiler that starts a linker, says both pids, and waits: stopped from outside only.
WAITING_COMPILER = (
    "import os, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])\n"
    "with open(sys.argv[1], 'a') as f: f.write(f'{os.getpid()} {child.pid}\\n')\n"
    "time.sleep(3600)"
)


def started_pids(path: Path, count: int) -> list[int]:
    """The pids the waiting compiler wrote to `path`, once `count` are there."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = path.read_text().split() if path.exists() else []
        if len(pids) == count:
            return [int(pid) for pid in pids]
        time.sleep(0.05)
    raise AssertionError(f"the compiler never wrote {count} pids to {path}")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_compile_on_another_thread_is_stopped_with_what_it_started(
    tmp_path: Path, source: Path
) -> None:
    """A shepherd ending (Ctrl-C) stops the compiles its admission threads wait for."""
    started, raised = tmp_path / "started", []

    def compile_() -> None:
        try:
            run_compiler([sys.executable, "-c", WAITING_COMPILER, str(started)], source, started)
        except CompilerStopped as error:
            raised.append(error)

    thread = threading.Thread(target=compile_)
    thread.start()
    pids = started_pids(started, 2)
    stop_compilers({threading.get_ident()})  # another thread's compile is left alone
    thread.join(1)
    assert thread.is_alive()
    stop_compilers({thread.ident})
    thread.join(30)
    assert not thread.is_alive() and len(raised) == 1
    assert all(ended(pid) for pid in pids), "the compiler or its linker is still running"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_compile_on_a_daemon_thread_ends_with_the_process(tmp_path: Path) -> None:
    """The compiler runs in a session of its own, out of a terminal's Ctrl-C: the
    process that started it must not leave it running when it exits."""
    started, source = tmp_path / "started", tmp_path / "program.mlir"
    source.write_text("module {}")
    exits_mid_compile = (
        "import sys, threading, time\n"
        "from pathlib import Path\n"
        "from pcp_core.iree.compile_process import run_compiler\n"
        "command = [sys.executable, '-c', sys.argv[1], sys.argv[2]]\n"
        "compile_ = lambda: run_compiler(command, Path(sys.argv[3]), Path(sys.argv[2]))\n"
        "threading.Thread(target=compile_, daemon=True).start()\n"
        "while not Path(sys.argv[2]).exists() or len(Path(sys.argv[2]).read_text().split()) < 2:\n"
        "    time.sleep(0.05)\n"
    )
    script = [sys.executable, "-c", exits_mid_compile, WAITING_COMPILER, str(started), str(source)]
    subprocess.run(script, check=True, timeout=60)
    pids = started_pids(started, 2)
    assert all(ended(pid) for pid in pids), "a compiler outlived the process that started it"


def ended(pid: int, within_s: float = 10.0) -> bool:
    """Whether process `pid` is gone, or a zombie left for init to reap, within
    `within_s`: a SIGKILLed process may still read as running (R) for a moment on a busy
    machine, while the kernel tears it down."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False
