"""The supervisor restarts crashes, and only crashes; a run without a device fails first;
its worker never outlives it."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pcp_core import exit_codes
from pcp_core.worker import supervisor as supervisor_module
from pcp_core.worker.supervisor import Supervisor
from tests.conftest import run_pcp


def exiting_with(code: int) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.exit({code})"]


@pytest.mark.parametrize(
    "code", [exit_codes.OK, exit_codes.CONFIGURATION, exit_codes.REFUSED, exit_codes.INTERRUPTED]
)
def test_final_exits_are_not_restarted(code: int) -> None:
    supervisor = Supervisor(exiting_with(code), backoff_s=0.01)
    assert supervisor.run() == code and supervisor.restarts == 0


def test_a_crash_is_restarted_with_backoff(tmp_path: Path) -> None:
    supervisor = Supervisor(exiting_with(exit_codes.CRASHED), max_restarts=2, backoff_s=0.01)
    assert supervisor.run() == exit_codes.CRASHED and supervisor.restarts == 2


def test_a_long_run_starts_the_crash_count_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Crashes after a stable run are not a loop: only crashes in a row count."""
    monkeypatch.setattr(supervisor_module, "STABLE_S", 0.0)  # every run counts as stable
    supervisor = Supervisor(exiting_with(exit_codes.CRASHED), max_restarts=2, backoff_s=0.01)
    stop_after = threading.Timer(1.5, supervisor.stop)
    stop_after.start()
    supervisor.run()  # ends when stopped (its last code: the child's, or a SIGTERM)
    stop_after.cancel()
    assert supervisor.restarts > 2  # more than max_restarts, and no crash loop declared


def test_a_crash_loop_is_reported_once(capsys: pytest.CaptureFixture[str]) -> None:
    supervisor = Supervisor(exiting_with(exit_codes.CRASHED), max_restarts=3, backoff_s=0.01)
    assert supervisor.run() == exit_codes.CRASHED
    output = capsys.readouterr()
    text = output.out + output.err
    assert text.count("crash loop") == 1 and text.count("restarting") == 3, text


def test_missing_device_stops_the_run_before_any_worker(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_pcp("train", "--algorithm", "diloco", "--backend", "rocm", "--out", str(out))
    assert result.returncode == exit_codes.CONFIGURATION, result.stderr
    assert "install ROCm" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()  # nothing started, no run directory


def test_worker_without_a_device_exits_without_restarts() -> None:
    result = run_pcp("worker", "--backend", "rocm", "--connect", "127.0.0.1:1")
    assert result.returncode == exit_codes.CONFIGURATION, result.stderr
    assert "install ROCm" in result.stderr and "restarting" not in result.stderr


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie has ended: only its exit status is left)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            if entry.name.isdigit() and alive(int(entry.name)):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == pid:  # the fields after the name: state, parent, ...
                    found.append(int(entry.name))
    return found


def signals_as_a_shell_leaves_them() -> None:
    """A child started in the background of a script would ignore SIGINT; not here."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture
def supervised_worker(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`pcp worker` (supervised: --restarts defaults to 5) joined to a socket that never
    answers, and the pid of the real worker, its child; both killed at the end."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(120)
        port = server.getsockname()[1]
        with (tmp_path / "worker.err").open("wb") as err:
            supervisor = subprocess.Popen(
                [
                    *(sys.executable, "-m", "pcp_core", "worker"),
                    *("--connect", f"127.0.0.1:{port}", "--timeout", "300"),
                    *("--state-dir", str(tmp_path / "state")),
                ],
                stderr=err,
                preexec_fn=signals_as_a_shell_leaves_them,
            )
        worker = None
        try:
            connection, _ = server.accept()  # the real worker has its device and says hello
            with connection:
                (worker,) = children(supervisor.pid)
                yield supervisor, worker
        finally:
            for pid in (supervisor.pid, worker):
                if pid is not None and alive(pid):
                    os.kill(pid, signal.SIGKILL)
            supervisor.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signalled_supervisor_ends_its_worker(
    supervised_worker: tuple[subprocess.Popen[bytes], int], signum: signal.Signals
) -> None:
    supervisor, worker = supervised_worker
    os.kill(supervisor.pid, signum)
    assert supervisor.wait(30) == 128 + signum  # 143 for SIGTERM, 130 for Ctrl-C
    assert not alive(worker), f"the worker outlived its supervisor's {signum.name}"


def test_a_killed_supervisor_takes_its_worker_along(
    supervised_worker: tuple[subprocess.Popen[bytes], int],
) -> None:
    """SIGKILL cannot be passed on: the kernel kills the worker when its parent dies."""
    supervisor, worker = supervised_worker
    os.kill(supervisor.pid, signal.SIGKILL)
    supervisor.wait(30)
    deadline = time.monotonic() + 10
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker), "the worker outlived its SIGKILLed supervisor"


def test_an_unreachable_shepherd_is_retried_past_max_restarts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A lost shepherd is no crash: retried beyond max_restarts, until give_up_after_s."""
    supervisor = Supervisor(
        exiting_with(exit_codes.UNREACHABLE), max_restarts=1, backoff_s=0.01, give_up_after_s=1.0
    )
    assert supervisor.run() == exit_codes.UNREACHABLE
    assert supervisor.restarts > 1
    text = "".join(capsys.readouterr())
    assert "crash loop" not in text and text.count("stayed out of reach") == 1, text


def test_a_join_resets_the_crash_count() -> None:
    """A worker that joined its shepherd before crashing was working: no crash loop."""
    joins_then_crashes = [
        sys.executable,
        "-c",
        "import os, sys; open(os.environ['PCP_JOINED_FILE'], 'ab').write(b'j'); sys.exit(1)",
    ]
    supervisor = Supervisor(joins_then_crashes, max_restarts=2, backoff_s=0.01)
    stop_after = threading.Timer(2.0, supervisor.stop)
    stop_after.start()
    supervisor.run()
    stop_after.cancel()
    assert supervisor.restarts > 2
