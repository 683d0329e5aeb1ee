"""DiLoCo runs end to end: `pcp train --algorithm diloco` and `pcp shepherd` + `pcp worker`."""

import json
from pathlib import Path
from typing import Any

from safetensors.numpy import load_file

RUN = ("--backend", "cpu", "--steps", "60", "--inner-steps", "10")  # 6 rounds of H = 10


def check_wire_bytes(summary: dict[str, Any], workers: int) -> None:
    """Each round moves the model once to and once from every worker, plus small headers."""
    expected = summary["model_bytes"] * workers * summary["rounds"]
    for key in ("bytes_sent", "bytes_received"):
        assert expected <= summary[key] <= 1.02 * expected, (key, summary[key], expected)


def test_two_workers_one_command(
    e2e: Any, tiny: tuple[str, ...], float32_wire: tuple[str, ...], tmp_path: Path
) -> None:
    """Two supervised local workers train, stop cleanly, and leave no process behind."""
    out = tmp_path / "run"
    args = ("--algorithm", "diloco", "--workers", "2", "--eval-every", "20", "--out", str(out))
    run = e2e.run_pcp("train", "train", *RUN, *float32_wire, *args, *tiny)
    assert run.process.returncode == 0, run.output()[-4000:]
    port = e2e.listening_port(run)
    assert port is not None, run.err()
    assert e2e.pids_with(f"127.0.0.1:{port}") == [], "a worker outlived `pcp train`"
    assert e2e.pids_with(str(out)) == []

    records = e2e.metrics(out)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["round"] for r in records] == list(range(6)) and summary["rounds"] == 6
    assert [r["workers"] for r in records] == [2] * 6
    assert not any(r["rejected"] for r in records) and {r["attempts"] for r in records} == {1}
    evals = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(evals) == 3 and summary["final_val_loss"] == evals[-1]
    assert evals[-1] < summary["unigram_entropy"], (evals, summary["unigram_entropy"])
    assert evals[-1] < evals[0], evals
    check_wire_bytes(summary, workers=2)
    for key in ("bytes_sent", "bytes_received"):
        assert sum(r[key] for r in records) == summary[key]
    assert summary["setup_bytes"] > 2 * summary["model_bytes"]  # program and tokens, once each

    checkpoint = load_file(out / "checkpoint.safetensors")
    momentum = [name for name in checkpoint if name.startswith("momentum.")]
    aggregator = [name for name in checkpoint if name.startswith("aggregator.")]
    params = len(checkpoint) - len(momentum) - len(aggregator)
    assert "wte" in checkpoint and len(momentum) == params and len(aggregator) == params

    for index in range(2):
        log = (out / f"worker-{index}.log").read_text()
        assert log.count("joined") == 1, log
        assert "stopping" in log and "reason=done" in log, log
        assert "Traceback" not in log and "error" not in log, log


def test_three_workers_join_a_shepherd(
    e2e: Any,
    tiny: tuple[str, ...],
    float32_wire: tuple[str, ...],
    token_file: Path,
    tmp_path: Path,
) -> None:
    """`pcp shepherd` waits for three separately started `pcp worker`s; all take part."""
    out = tmp_path / "run"
    shepherd, address = e2e.shepherd(
        *RUN,
        *float32_wire,  # every round then moves exactly the model
        *("--workers", "3", "--token-file", str(token_file)),
        *("--eval-every", "0", "--out", str(out)),
        *tiny,
    )
    token = ("--token-file", str(token_file), "--restarts", "0")
    workers = [
        e2e.pcp(f"worker-{i}", "worker", "--connect", address, "--backend", "cpu", *token)
        for i in range(3)
    ]
    assert shepherd.wait(300) == 0, shepherd.output()[-4000:]
    # the evaluation program is built before any worker is admitted, not in a round
    log = shepherd.err()
    assert log.index("evaluating on") < log.index("worker joined"), log[-4000:]
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()
        assert "reason=done" in worker.err(), worker.err()

    records = e2e.metrics(out)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["workers"] for r in records] == [3] * 6
    assert sorted(records[-1]["worker_losses"]) == ["0", "1", "2"]
    check_wire_bytes(summary, workers=3)
    assert e2e.pids_with(address) == []
