import json
import os
import subprocess
import sys
from pathlib import Path

from pcp_core.testing import AlgorithmConformance

TINY = ("--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16")


class TestFedAvg(AlgorithmConformance):
    algorithm_name = "fedavg"
    extra_args = ("--workers", "2", "--average-every", "10")


def pcp(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}  # help lines unwrapped
    return subprocess.run(
        [sys.executable, "-m", "pcp_core", *args], capture_output=True, text=True, cwd=cwd, env=env
    )


def test_two_workers_train_a_model_that_samples(tmp_path: Path) -> None:
    """Real processes: a shepherd and two workers over TCP, three rounds; the averaged
    model is checkpointed, and `pcp sample` reads it."""
    run = tmp_path / "run"
    args = ("--algorithm", "fedavg", "--workers", "2", "--steps", "30", "--average-every", "10")
    result = pcp("train", *args, *TINY, "--out", str(run), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rounds = [record for record in rounds if "round" in record]
    assert [record["round"] for record in rounds] == [0, 1, 2]
    assert rounds[-1]["val_loss"] < rounds[0]["loss"]
    sampled = pcp("sample", str(run), "--prompt", "the ", "--tokens", "20", cwd=tmp_path)
    assert sampled.returncode == 0 and sampled.stdout.startswith("the "), sampled.stderr


def test_its_setting_is_a_flag_and_a_bad_value_one_line(tmp_path: Path) -> None:
    assert "--average-every" in pcp("train", "--help", cwd=tmp_path).stdout
    result = pcp("train", "--algorithm", "fedavg", "--average-every", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and "average_every" in result.stderr


def test_a_round_not_a_multiple_of_a_call_is_refused(tmp_path: Path) -> None:
    args = ("--algorithm", "fedavg", "--average-every", "10", "--steps-per-call", "4")
    result = pcp("train", *args, *TINY, "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "multiple of --steps-per-call" in result.stderr
    assert "Traceback" not in result.stderr
