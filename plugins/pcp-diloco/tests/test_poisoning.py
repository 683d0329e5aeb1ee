"""A worker that holds the secret and sends finite but huge pseudo-gradients, through the
real worker API (bad_worker.py): refused, or its outer step rolled back, and the run
ends with sane parameters in its checkpoint."""

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from .test_faults import BAD_WORKER, finished

pytestmark = pytest.mark.serial  # worker timeouts of seconds


def run_with_bad_workers(
    e2e: Any,
    tiny: tuple[str, ...],
    token_file: Path,
    tmp_path: Path,
    honest: int,
    modes: list[str],
    *args: str,
) -> tuple[str, Path]:
    """A shepherd, `honest` workers and one bad_worker.py per mode, to the run's end;
    the shepherd's log and the run directory."""
    port = e2e.free_port()
    address = f"127.0.0.1:{port}"
    e2e.own(address)
    out = tmp_path / "run"
    workers = honest + len(modes)
    shepherd = e2e.pcp(
        "shepherd",
        "shepherd",
        *("--backend", "cpu", "--workers", str(workers), "--port", str(port)),
        *("--token-file", str(token_file), "--steps", "60", "--inner-steps", "10"),
        *("--eval-every", "0", "--out", str(out), *args, *tiny),
    )
    env = {**os.environ, "PCP_TOKEN": token_file.read_text().strip()}
    for i in range(honest):
        e2e.pcp(f"honest-{i}", "worker", "--connect", address, "--token-file", str(token_file))
    for i, mode in enumerate(modes):
        state = str(tmp_path / f"state-{i}")
        e2e.start(f"bad-{i}", [sys.executable, str(BAD_WORKER), mode, address, state], env=env)
    return finished(shepherd), out


def assert_sane_checkpoint(out: Path) -> None:
    params = load_file(out / "checkpoint.safetensors")
    largest = max(float(np.abs(array).max()) for array in params.values())
    assert np.isfinite(largest) and largest < 100, largest


def lines_with(log: str, *words: str) -> list[str]:
    return [line for line in log.splitlines() if all(word in line for word in words)]


def test_huge_values_behind_an_ordinary_norm_are_refused(
    e2e: Any, tiny: tuple[str, ...], token_file: Path, tmp_path: Path
) -> None:
    """Every value 1e30 (finite), announcing an ordinary norm: the shepherd's own norm
    (float64) does not match, so the result is refused, in every round (the worker stays
    after a refusal that follows the fetch); a result without losses is refused too, and
    every round's loss in metrics.jsonl is a number."""
    log, out = run_with_bad_workers(
        e2e, tiny, token_file, tmp_path, 2, ["huge", "no-losses"], "--min-workers", "2"
    )
    refused = lines_with(log, "result rejected", "bad-huge", "announced")
    assert len(refused) == 5, log[-5000:]  # refused after the fetch, it stays for the next
    assert lines_with(log, "result rejected", "bad-no-losses", "without losses"), log[-5000:]
    records = e2e.metrics(out)
    assert len(records) == 6
    assert all(isinstance(r["loss"], float) for r in records), records
    assert_sane_checkpoint(out)


def test_a_poisoned_first_round_is_rolled_back(
    e2e: Any, tiny: tuple[str, ...], token_file: Path, tmp_path: Path
) -> None:
    """Two workers under the plain mean, one sending 1e30 everywhere from round 0 with its
    true norm: with two norms there is no telling who is the outlier, so its result is
    summed; the outer step's norm is then implausible, the step is undone, the round runs
    again without it (a warning names it), later rounds refuse it by its norm, and the
    run ends with sane parameters. (The default aggregator clips it from the start.)"""
    trusting = ("--aggregator", "mean", "--result-check", "none")
    log, out = run_with_bad_workers(e2e, tiny, token_file, tmp_path, 1, ["huge-first"], *trusting)
    rolled = lines_with(log, "outer step rolled back", "bad-huge-first")
    assert rolled and "round=0" in rolled[0], log[-5000:]
    assert lines_with(log, "result rejected", "bad-huge-first", "excluded from this round")
    assert lines_with(log, "result rejected", "bad-huge-first", "over 10x the median")
    records = e2e.metrics(out)
    assert [r["round"] for r in records] == list(range(6))
    assert all(r["workers"] == 1 for r in records), records
    assert_sane_checkpoint(out)


def test_a_poisoned_first_round_under_the_default_aggregator(
    e2e: Any, tiny: tuple[str, ...], token_file: Path, tmp_path: Path
) -> None:
    """The same attack under the defaults: centered clipping counts the 1e30 result as at
    most the honest one's distance from the last merge, and the merge without it is the
    better one, so it is left out or counted for nothing from round 0 on, named in every
    round, and the run ends with sane parameters without a step to undo."""
    log, out = run_with_bad_workers(e2e, tiny, token_file, tmp_path, 1, ["huge-first"])
    named = [line for line in log.splitlines() if "bad-huge-first" in line and "round=" in line]
    named = [line for line in named if "left out" in line or "down-weighted" in line]
    assert any("round=0" in line for line in named), log[-5000:]
    assert not lines_with(log, "outer step rolled back")
    assert len(e2e.metrics(out)) == 6
    assert_sane_checkpoint(out)
