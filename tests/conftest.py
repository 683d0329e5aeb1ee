"""Helpers and session fixtures for the core's tests.

The compile cache is pcp-core's pytest plugin's (pcp_core/testing/pytest_plugin.py): one
per run, made before pytest-xdist starts its workers so they all share it, or the
`PCP_CACHE_DIR` the caller set (nox shares one between its sessions). A test of the cache
itself points `PCP_CACHE_DIR` at a directory of its own.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def ctrl_c_reaches_children() -> None:
    """test_watching presses Ctrl-C (SIGINT) on a run, as a terminal would. A shell
    starting pytest in the background without job control ignores SIGINT, children
    inherit that, and the run would rightly ignore it too: catch it here, and children
    start with the default again (as pcp-diloco's conftest does)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_pcp(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run the `pcp` CLI in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "pcp_core", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=timeout,
    )
