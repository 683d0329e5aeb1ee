"""`pcp train --resume` of a local run: it continues from its checkpoint (parameters and
the inner optimizer's state) on the trajectory the uninterrupted run takes, and says in
one line what it cannot resume."""

from pathlib import Path

import numpy as np

from pcp_core.program import checkpoint
from tests.conftest import run_pcp

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32"]
# a schedule that does not depend on --steps (constant after the warm-up), so a run of 20
# steps resumed to 40 is the run of 40 steps
FLAT = ["--lr", "3e-3", "--min-lr", "3e-3", "--warmup-steps", "5", "--eval-every", "20"]


def params(run: Path) -> dict[str, np.ndarray]:
    tensors, _ = checkpoint.load(run / "checkpoint.safetensors")
    return tensors


def test_a_resumed_local_run_follows_the_uninterrupted_one(tmp_path: Path) -> None:
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    done = run_pcp("train", "--steps", "40", "--out", str(whole), *FLAT, *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    first = run_pcp("train", "--steps", "20", "--out", str(halves), *FLAT, *TINY)
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_pcp("train", "--resume", str(halves), "--steps", "40", *FLAT, *TINY)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming" in again.stderr
    expected, got = params(whole), params(halves)
    assert expected.keys() == got.keys() and any(k.startswith("optimizer.") for k in got)
    for name, array in expected.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)
    steps = [line for line in (halves / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == len((whole / "metrics.jsonl").read_text().splitlines())


def test_what_cannot_be_resumed_is_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert run_pcp("train", "--steps", "20", "--out", str(run), *FLAT, *TINY).returncode == 0
    finished = run_pcp("train", "--resume", str(run), "--steps", "20", *FLAT, *TINY)
    assert finished.returncode != 0 and "pass a larger --steps" in finished.stderr
    refused = run_pcp("train", "--steps", "20", "--out", str(run), *FLAT, *TINY)
    assert refused.returncode != 0 and f"--resume {run}" in refused.stderr
    (run / "checkpoint.safetensors").write_bytes(b"not a checkpoint")
    (run / "checkpoint-previous.safetensors").unlink(missing_ok=True)
    broken = run_pcp("train", "--resume", str(run), "--steps", "40", *FLAT, *TINY)
    assert broken.returncode != 0 and "no intact checkpoint" in broken.stderr
    assert "Traceback" not in broken.stderr
