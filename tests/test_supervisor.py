"""The supervisor restarts crashes, and only crashes; a run without a device fails first."""

import sys
import threading
from pathlib import Path

import pytest

from pcp_core import exit_codes
from pcp_core import supervisor as supervisor_module
from pcp_core.supervisor import Supervisor
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
