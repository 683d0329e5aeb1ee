"""Fixtures for the DiLoCo end-to-end tests: real `pcp` processes talking over 127.0.0.1.

The `e2e` fixture (`pcp_core.testing.processes.E2E`) starts processes with their output
in files, and kills (by pid) any it started that are still running when the test ends.
The `network` fixture puts processes on hosts of their own (netns.py): start one there
with `e2e.start(name, net.command(host, argv))`. The compile cache is pcp-core's pytest
plugin's: one per run, shared by pytest-xdist's workers, or the caller's `PCP_CACHE_DIR`.
"""

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pcp_core.testing.processes import E2E

from . import netns

# Small enough to compile in seconds, big enough that frame headers stay well under
# 2% of what a round moves.
TINY = ("--n-layer", "1", "--n-head", "2", "--n-embd", "64", "--block-size", "32")
TINY_RUN = (*TINY, "--batch-size", "8")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "serial: counts on timeouts of seconds or a machine of its own; nox runs these alone, "
        "after the others ran in parallel (pytest-xdist)",
    )


@pytest.fixture(scope="session", autouse=True)
def worker_state_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Workers started without --state-dir save their inner state here, not in ~/.local."""
    path = tmp_path_factory.mktemp("state-home")
    os.environ["XDG_STATE_HOME"] = str(path)
    return path


@pytest.fixture
def tiny() -> tuple[str, ...]:
    """Model and batch flags of the tiny run the tests share."""
    return TINY_RUN


@pytest.fixture
def float32_wire() -> tuple[str, ...]:
    """Both directions as float32, for tests of float32's arithmetic or byte counts (fp4,
    the default, is test_codec_rounds's)."""
    return ("--codec", "f32", "--codec-down", "f32")


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("s3cret-for-the-diloco-tests\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def e2e(tmp_path: Path) -> Iterator[E2E]:
    harness = E2E(tmp_path / "processes")
    yield harness
    harness.end_all()


@pytest.fixture
def network() -> Iterator[Callable[[int], netns.Network]]:
    """`network(n)` builds n hosts on a switch (see netns.py), torn down with the test.
    Skips where namespaces cannot be built, and fails under CI instead."""
    if reason := netns.netns_unavailable():
        netns.skip_or_fail(reason)
    with contextlib.ExitStack() as stack:
        yield lambda count: stack.enter_context(netns.network(count))
