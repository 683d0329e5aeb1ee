"""A disk that fills up during a run (a real tmpfs, mounted by the test as root): a
checkpoint that cannot be written is one log line, the previous checkpoint stays, and
training goes on; space freed, the next checkpoint is written; still full at the end,
the run exits with exit_codes.CHECKPOINT and one error line."""

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pcp_core import exit_codes
from pcp_core.program import checkpoint

pytestmark = pytest.mark.slow

TINY = ("--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16")
RUN = ("train", "--backend", "cpu", "--steps", "4000", "--eval-every", "50", "--eval-batches", "1")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of the test's own; skipped where it cannot be mounted, failed in CI."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True
    )
    if done.returncode != 0:
        reason = f"cannot mount a tmpfs: {done.stderr.decode().strip()}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """A file that takes all of `disk` but `leave` bytes."""
    filler = disk / "filler"
    stats = os.statvfs(disk)
    free = stats.f_bavail * stats.f_frsize
    with filler.open("wb") as file, contextlib.suppress(OSError):
        file.write(b"\0" * max(free - leave, 0))
    return filler


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def start(out: Path, err: Path) -> subprocess.Popen[bytes]:
    with err.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "pcp_core", *RUN, *TINY, "--out", str(out)], stderr=stderr
        )


@pytest.mark.parametrize("freed", [True, False])
def test_a_full_disk_costs_checkpoints_not_the_run(
    small_disk: Path, tmp_path: Path, freed: bool
) -> None:
    out, err = small_disk / "run", tmp_path / "train.err"
    run = start(out, err)
    try:
        wait_for((out / "checkpoint.safetensors").exists, 120, "a first checkpoint")
        filler = fill(small_disk, leave=48 * 1024)  # room for metrics lines, not a checkpoint
        wait_for(lambda: "checkpoint not written" in err.read_text(), 120, "a failed checkpoint")
        if freed:
            filler.unlink()
        code = run.wait(300)
    finally:
        if run.poll() is None:
            run.kill()
    log = err.read_text()
    assert "Traceback" not in log, log[-3000:]
    assert not list(out.glob("*.partial")), list(out.iterdir())
    _, metadata = checkpoint.load_latest(out / "checkpoint.safetensors")
    if freed:
        assert code == 0, log[-3000:]
        assert metadata["step"] == "4000"
    else:
        assert code == exit_codes.CHECKPOINT, log[-3000:]
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "last checkpoint was not written" in errors[0], log[-3000:]
        assert 0 < int(metadata["step"]) < 4000
