"""What trainers expect: gradient accumulation (`--grad-accum`) that gives the larger
batch's run, and learning-rate schedules after the warmup (`--lr-schedule`)."""

import json
from pathlib import Path

import numpy as np
import optax
import pytest

from pcp_core.optimizers import InnerSettings, learning_rate
from pcp_core.program import checkpoint
from tests.conftest import run_pcp

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32"]


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_four_micro_batches_of_eight_are_a_batch_of_thirty_two(tmp_path: Path) -> None:
    common = ["train", "--steps", "20", "--eval-every", "0", *TINY]
    whole = run_pcp(*common, "--batch-size", "32", "--out", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    accumulated = run_pcp(
        *common, "--batch-size", "8", "--grad-accum", "4", "--out", str(tmp_path / "accum")
    )
    assert accumulated.returncode == 0, accumulated.stderr[-3000:]
    np.testing.assert_allclose(losses(tmp_path / "accum"), losses(tmp_path / "whole"), rtol=1e-5)
    expected, _ = checkpoint.load(tmp_path / "whole" / "checkpoint.safetensors")
    got, _ = checkpoint.load(tmp_path / "accum" / "checkpoint.safetensors")
    for name, array in expected.items():
        # Adam divides by the gradient's own scale: summation order shows at 1e-6
        np.testing.assert_allclose(got[name], array, rtol=1e-4, atol=2e-5, err_msg=name)
    summary = json.loads((tmp_path / "accum" / "summary.json").read_text())
    assert summary["tokens"] == 20 * 32 * 32  # a step takes all four micro-batches


def rates(schedule: str, steps: range) -> list[float]:
    settings = InnerSettings(
        lr=1e-2, min_lr=1e-3, warmup_steps=4, total_steps=40, schedule=schedule, decay_steps=8
    )
    rate = learning_rate(settings)
    return [float(rate(step)) for step in steps]


def test_the_schedules_after_a_shared_warmup() -> None:
    warmup = rates("cosine", range(5))
    for kind in ("linear", "constant", "wsd"):
        assert rates(kind, range(5)) == pytest.approx(warmup)
    cosine = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 4, 40, 1e-3)
    assert rates("cosine", range(45)) == pytest.approx([float(cosine(s)) for s in range(45)])
    assert rates("linear", [22, 40, 50]) == pytest.approx([5.5e-3, 1e-3, 1e-3])
    assert rates("constant", [4, 40, 50]) == pytest.approx([1e-2] * 3)
    # warmup, stable until the last 8 steps, then linear down to min_lr
    assert rates("wsd", [4, 32, 36, 40, 50]) == pytest.approx([1e-2, 1e-2, 5.5e-3, 1e-3, 1e-3])


def test_a_schedule_is_chosen_on_the_command_line(tmp_path: Path) -> None:
    result = run_pcp(
        *("train", "--steps", "20", "--eval-every", "0", "--lr-schedule", "wsd"),
        *("--decay-fraction", "0.5", "--out", str(tmp_path / "run"), *TINY),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    bad = run_pcp("train", "--lr-schedule", "step", "--out", str(tmp_path / "bad"))
    assert bad.returncode != 0
    assert "lr_schedule must be one of cosine, linear, constant, wsd" in bad.stderr


@pytest.mark.parametrize(
    "algorithm", [[], ["--algorithm", "diloco", "--workers", "2", "--inner-steps", "10"]]
)
def test_checkpoints_kept_every_n_steps_the_newest_k(tmp_path: Path, algorithm) -> None:
    run = tmp_path / "run"
    result = run_pcp(
        *("train", "--steps", "60", "--eval-every", "0", "--save-every", "20", "--keep", "2"),
        *("--out", str(run), *TINY, *algorithm),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    kept = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert kept == ["step-000000040.safetensors", "step-000000060.safetensors"]
    at_40, metadata = checkpoint.load(run / "checkpoints" / kept[0])
    assert json.loads(metadata["step"]) == 40
    final, _ = checkpoint.load(run / "checkpoint.safetensors")
    assert any(not np.array_equal(at_40[name], final[name]) for name in final)
