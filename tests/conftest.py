"""Shared fixtures: one compile cache per test session, helpers for installed plugins."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the whole session, so tests that compile the same program share it."""
    path = tmp_path_factory.mktemp("vmfb-cache")
    os.environ["PCP_CACHE_DIR"] = str(path)
    return path


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
