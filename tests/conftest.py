"""Helpers for the core's tests.

The compile cache is pcp-core's pytest plugin's (pcp_core/testing/pytest_plugin.py): one
per run, made before pytest-xdist starts its workers so they all share it, or the
`PCP_CACHE_DIR` the caller set (nox shares one between its sessions). A test of the cache
itself points `PCP_CACHE_DIR` at a directory of its own.
"""

import os
import subprocess
import sys
from pathlib import Path


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
