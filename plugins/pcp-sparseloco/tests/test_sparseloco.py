"""SparseLoCo end to end: real `pcp` processes over TCP on 127.0.0.1."""

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from pcp_core.testing import AlgorithmConformance
from pcp_core.testing.algorithm_suite import run_pcp
from pcp_core.testing.processes import E2E

TINY = ("--n-layer", "1", "--n-head", "2", "--n-embd", "64", "--block-size", "32")
SPARSELOCO = ("--algorithm", "sparseloco", "--backend", "cpu", *TINY, "--batch-size", "8")
DILOCO_F32 = ("--algorithm", "diloco", "--codec", "f32", "--codec-down", "f32")


class TestSparseLoco(AlgorithmConformance):
    algorithm_name = "sparseloco"
    extra_args = ("--workers", "2", "--inner-steps", "10")


def rounds_of(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [record for record in records if "round" in record]


def test_rounds_move_fifty_times_fewer_bytes_than_float32_diloco(tmp_path: Path) -> None:
    """Two workers, five rounds of each algorithm on a model 256 wide: each steady round's
    bytes on the wire, both directions together, against float32 DiLoCo's (53 times fewer
    here: 65 up, 45 down, where a denser tenth of each chunk is sent); the model learns,
    and `pcp sample` reads it."""
    wider = ("--n-embd", "256", "--workers", "2", "--steps", "50", "--inner-steps", "10")
    runs = {}
    for name, algorithm in [("sparseloco", ()), ("diloco", DILOCO_F32)]:
        runs[name] = tmp_path / name
        args = (*SPARSELOCO, *algorithm, *wider, "--eval-every", "30", "--out", str(runs[name]))
        result = run_pcp("train", *args, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    sparse, dense = rounds_of(runs["sparseloco"]), rounds_of(runs["diloco"])
    assert [record["round"] for record in sparse] == list(range(5))
    assert sparse[-1]["val_loss"] < sparse[0]["loss"]
    for ours, theirs in zip(sparse[1:], dense[1:], strict=True):  # the first sends the model
        both = [record["bytes_sent"] + record["bytes_received"] for record in (ours, theirs)]
        assert both[1] / both[0] > 50, (ours, theirs)
        assert theirs["bytes_received"] / ours["bytes_received"] > 60  # the workers' messages
    sampled = run_pcp(
        "sample", str(runs["sparseloco"]), "--prompt", "the ", "--tokens", "10", cwd=tmp_path
    )
    assert sampled.returncode == 0 and sampled.stdout.startswith("the "), sampled.stderr


def test_a_robust_aggregator_and_spot_checks(tmp_path: Path) -> None:
    """The core's round machinery works for it: centered clipping merges four workers'
    sparse messages and the model learns, and spot checks re-run every result from the
    state its round started from (the accumulator included) and find each honest."""
    run = tmp_path / "run"
    args = ("--workers", "4", "--batch-size", "4", "--steps", "40", "--eval-every", "10")
    args += ("--aggregator", "centered-clip", "--spot-check", "1")
    result = run_pcp("train", *SPARSELOCO, *args, "--out", str(run), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rounds = rounds_of(run)
    assert len(rounds) == 4 and all(not record["rejected"] for record in rounds)
    assert sum(record["spot_checks"] for record in rounds) >= 4
    assert rounds[-1]["val_loss"] < rounds[0]["val_loss"]
    busy = json.loads((run / "summary.json").read_text())["worker_utilisation"]
    assert len(busy) == 4 and all(0 < share < 1 for share in busy.values())


def test_value_wise_aggregators_are_refused(tmp_path: Path) -> None:
    """A trimmed mean or a median would merge away values that one worker sent."""
    for aggregator in ("trimmed-mean", "median"):
        args = ("--workers", "4", "--aggregator", aggregator, "--out", str(tmp_path / "run"))
        result = run_pcp("train", *SPARSELOCO, *args, "--overwrite", cwd=tmp_path)
        assert result.returncode == 2, result.stderr[-3000:]
        assert "merges value by value" in result.stderr and "Traceback" not in result.stderr


def test_settings_are_flags_and_bad_values_one_line(tmp_path: Path) -> None:
    shown = run_pcp("train", "--help", cwd=tmp_path).stdout
    assert all(flag in shown for flag in ("--density", "--down-density", "--feedback-decay"))
    for flag, value in [("--density", "0.9"), ("--chunk", "8"), ("--feedback-decay", "2")]:
        result = run_pcp("train", "--algorithm", "sparseloco", flag, value, cwd=tmp_path)
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.startswith("error:") and "Traceback" not in result.stderr


def test_rounds_of_any_length_run_in_calls_that_divide_them(tmp_path: Path) -> None:
    """H = 5 under the default 10 steps a call: calls of 5 steps."""
    run = tmp_path / "run"
    args = ("--workers", "2", "--inner-steps", "5", "--steps", "20", "--out", str(run))
    result = run_pcp("train", *SPARSELOCO, *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [record["step"] for record in rounds_of(run)] == [5, 10, 15, 20]


@pytest.mark.slow
def test_a_killed_shepherd_resumes_on_the_same_trajectory(tmp_path: Path) -> None:
    """kill -9 the shepherd mid-run and start it again with --resume: its supervised
    workers come back with the inner state and the accumulator of the round the
    checkpoint ends, and the run ends with the parameters of an uninterrupted one."""
    e2e = E2E(tmp_path / "processes")
    try:
        settings = (*SPARSELOCO[2:], "--steps", "400", "--inner-steps", "10", "--eval-every", "0")
        uninterrupted = ("train", "--algorithm", "sparseloco", "--workers", "2")
        reference = e2e.run_pcp(
            "reference", *uninterrupted, "--out", str(tmp_path / "ref"), *settings
        )
        assert reference.process.returncode == 0, reference.output()[-3000:]

        token = tmp_path / "token"
        token.write_text("s3cret-for-the-sparseloco-tests\n")
        token.chmod(0o600)
        port = e2e.free_port()
        address = f"127.0.0.1:{port}"
        e2e.own(address)
        shepherd = ("shepherd", "--algorithm", "sparseloco", "--workers", "2", "--port", str(port))
        shepherd += ("--token-file", str(token), *settings)
        out = tmp_path / "run"
        first = e2e.pcp("shepherd", *shepherd, "--out", str(out))
        for i in range(2):
            worker = ("worker", "--connect", address, "--token-file", str(token))
            e2e.pcp(f"worker-{i}", *worker, "--state-dir", str(tmp_path / f"state-{i}"))
        e2e.wait_for(lambda: len(e2e.metrics(out)) >= 4, 240, "4 rounds")
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL  # killed mid-run, not finished
        assert len(e2e.metrics(out)) < 40
        time.sleep(1)
        resumed = e2e.pcp("resumed", *shepherd, "--resume", str(out))
        assert resumed.wait(400) == 0, resumed.output()[-3000:]
        assert "resuming" in resumed.err()
        assert [r["round"] for r in e2e.metrics(out)] == list(range(40))
        ours = load_file(out / "checkpoint.safetensors")
        for name, array in load_file(tmp_path / "ref" / "checkpoint.safetensors").items():
            np.testing.assert_allclose(ours[name], array, rtol=1e-6, atol=1e-7, err_msg=name)
        for i in range(2):
            log = (tmp_path / "processes" / f"worker-{i}.err").read_text()
            assert log.count("joined") == 2 and "inner state restored" in log, log[-3000:]
    finally:
        e2e.end_all()
