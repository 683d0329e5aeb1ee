"""Faults a run must survive, with real processes, sockets and signals: a suspended
worker, a killed worker, the only worker killed, bad results, a diverging run, and the
shepherd killed and resumed."""

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

pytestmark = pytest.mark.serial  # worker timeouts of seconds

DILOCO = ("train", "--algorithm", "diloco", "--backend", "cpu", "--eval-every", "0")
BAD_WORKER = Path(__file__).with_name("bad_worker.py")


def worker_pids(e2e: Any, address: str) -> list[int]:
    """The worker processes themselves (not their supervisors) connected to `address`."""
    return e2e.pids_with(f"worker --connect {address} --backend cpu --transport capnp-tcp")


def start_one_command(
    e2e: Any, tiny: tuple[str, ...], out: Path, *args: str, rounds_first: int = 3
) -> tuple[Any, str]:
    """`pcp train --algorithm diloco ARGS`, once it has finished `rounds_first` rounds."""
    run = e2e.pcp("train", *DILOCO, "--out", str(out), *args, *tiny)
    e2e.wait_for(
        lambda: len(e2e.metrics(out)) >= rounds_first or run.process.poll() is not None,
        240,
        f"{rounds_first} rounds",
    )
    assert run.process.poll() is None, run.output()[-4000:]
    address = f"127.0.0.1:{e2e.listening_port(run)}"
    e2e.own(address)
    return run, address


def finished(run: Any, timeout: float = 300) -> str:
    """Wait for a run to end with exit code 0; its stderr."""
    code = run.wait(timeout)
    assert code == 0, run.output()[-5000:]
    return run.err()


def test_suspended_worker_is_dropped_then_taken_back(
    e2e: Any, tiny: tuple[str, ...], tmp_path: Path
) -> None:
    """SIGSTOP one of two workers: the run goes on without it once --worker-timeout has
    passed; SIGCONT: it finds its connection gone, its supervisor starts it again, and it
    rejoins with the inner state it had saved."""
    out = tmp_path / "run"
    args = ("--workers", "2", "--worker-timeout", "3", "--steps", "2400", "--inner-steps", "10")
    run, address = start_one_command(e2e, tiny, out, *args)
    stopped = worker_pids(e2e, address)[0]
    os.kill(stopped, signal.SIGSTOP)
    paused_at = len(e2e.metrics(out))
    e2e.wait_for(
        lambda: any(r["workers"] == 1 for r in e2e.metrics(out)[paused_at:]),
        60,
        "a round without the suspended worker",
    )
    os.kill(stopped, signal.SIGCONT)
    resumed_at = len(e2e.metrics(out))
    e2e.wait_for(
        lambda: any(r["workers"] == 2 for r in e2e.metrics(out)[resumed_at:]),
        120,
        "the resumed worker to take part again",
    )
    log = finished(run)
    assert "worker lost" in log, log[-3000:]
    # the resumed process found its shepherd gone and exited: no crash, it came back
    assert "the shepherd is out of reach; trying again" in log, log[-3000:]
    worker_logs = "".join((out / f"worker-{i}.log").read_text() for i in range(2))
    assert "lost the shepherd" in worker_logs
    assert "inner state restored" in worker_logs
    assert all(r["attempts"] >= 1 for r in e2e.metrics(out))
    assert len(e2e.metrics(out)) == 240


def test_losing_the_only_worker_waits_for_it(
    e2e: Any, tiny: tuple[str, ...], tmp_path: Path
) -> None:
    """Kill the only worker: the shepherd waits for it instead of failing the run, its
    supervisor restarts it, and the run finishes."""
    out = tmp_path / "run"
    run, address = start_one_command(
        e2e, tiny, out, "--workers", "1", "--steps", "600", "--inner-steps", "10"
    )
    os.kill(worker_pids(e2e, address)[0], signal.SIGKILL)
    log = finished(run)
    assert "waiting for workers" in log, log[-3000:]
    assert "round below quorum" in log
    records = e2e.metrics(out)
    assert len(records) == 60 and all(r["workers"] == 1 for r in records)
    assert "inner state restored" in (out / "worker-0.log").read_text()


@pytest.mark.parametrize(
    "rounds",
    [(), ("--deltas", "pushed"), ("--overlap", "ahead")],
    ids=["fetched", "pushed", "ahead"],
)
def test_bad_results_are_refused(
    e2e: Any, tiny: tuple[str, ...], token_file: Path, tmp_path: Path, rounds: tuple[str, ...]
) -> None:
    """Workers that send NaN, a 1000x norm, a missing tensor, a wrong shape, a replayed
    old result, half a result, or share another's name: each is refused with a log line
    naming it, the honest results still make every round, and the loss falls; whether
    the shepherd fetches each pseudo-gradient, it follows its Result unasked, or results
    come ahead of their Assignment (a refused one's successor is then run again)."""
    port = e2e.free_port()
    address = f"127.0.0.1:{port}"
    e2e.own(address)
    out = tmp_path / "run"
    modes = ["nan", "norm", "missing", "shape", "stale", "partial", "twin", "twin"]
    shepherd = e2e.pcp(
        "shepherd",
        "shepherd",
        *("--backend", "cpu", "--workers", "9", "--min-workers", "2", "--port", str(port)),
        *("--token-file", str(token_file), "--steps", "100", "--inner-steps", "10"),
        *("--eval-every", "0", "--out", str(out), *tiny, *rounds),
    )
    env = {**os.environ, "PCP_TOKEN": token_file.read_text().strip()}
    for i in range(2):
        e2e.pcp(f"honest-{i}", "worker", "--connect", address, "--token-file", str(token_file))
    for i, mode in enumerate(modes):
        state = str(tmp_path / f"state-{i}")
        e2e.start(f"bad-{i}", [sys.executable, str(BAD_WORKER), mode, address, state], env=env)
    log = finished(shepherd)

    def rejected(worker: str, reason: str) -> bool:
        return any(
            "result rejected" in line and worker in line and reason in line
            for line in log.splitlines()
        )

    assert rejected("bad-nan", "non-finite result"), log[-5000:]
    assert rejected("bad-norm", "the round's median") or rejected(
        "bad-norm", "over 10x the median"
    ), log[-5000:]
    assert rejected("bad-missing", "incomplete result: "), log[-5000:]
    # float32 finds the shape wrong; fp4 (the default) finds bytes that do not fit it
    assert rejected("bad-shape", "unexpected tensor") or rejected("bad-shape", "tensor wte: fp4"), (
        log[-5000:]
    )
    assert rejected("bad-stale", "stale result: for round 0"), log[-5000:]
    assert any("worker lost" in x and "bad-partial" in x for x in log.splitlines()), log[-5000:]
    twins = [line for line in log.splitlines() if "twin" in line and "already connected" in line]
    assert len(twins) == 1, log[-5000:]  # the second twin is refused, the first stays

    records = e2e.metrics(out)
    assert len(records) == 10
    for record in records[1:]:
        assert record["workers"] >= 2, record
    losses = [r["loss"] for r in records]
    assert losses[-1] < losses[1], losses
    params = load_file(out / "checkpoint.safetensors")
    assert all(np.isfinite(array).all() for array in params.values())


def test_diverging_run_stops_loudly(e2e: Any, tiny: tuple[str, ...], tmp_path: Path) -> None:
    """--lr 1e12: one line of error, a non-zero exit, no checkpoint of broken parameters,
    and a metrics file that is valid JSON throughout."""
    out = tmp_path / "run"
    args = ("--workers", "2", "--steps", "40", "--inner-steps", "10", "--lr", "1e12")
    run = e2e.run_pcp("train", *DILOCO, "--out", str(out), *args, *tiny)
    assert run.process.returncode == 2, run.output()[-3000:]
    errors = [line for line in run.err().splitlines() if line.startswith("error:")]
    assert errors == ["error: round 0: every result was NaN or Inf, the run diverged; lower --lr"]
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line)
    if (out / "checkpoint.safetensors").exists():
        params = load_file(out / "checkpoint.safetensors")
        assert all(np.isfinite(array).all() for array in params.values())


def start_supervised_run(
    e2e: Any, token_file: Path, tmp_path: Path, out: Path, settings: tuple[str, ...]
) -> tuple[Any, tuple[str, ...]]:
    """A shepherd on a free port writing to `out` and two supervised workers with their
    own state folders; returns the shepherd's process and its arguments (without
    --out), for a test that kills and resumes it."""
    port = e2e.free_port()
    address = f"127.0.0.1:{port}"
    e2e.own(address)
    shepherd_args = (
        *("shepherd", "--backend", "cpu", "--workers", "2", "--port", str(port)),
        *("--token-file", str(token_file), *settings),
    )
    shepherd = e2e.pcp("shepherd", *shepherd_args, "--out", str(out))
    for i in range(2):
        e2e.pcp(
            f"worker-{i}",
            *("worker", "--connect", address, "--token-file", str(token_file)),
            *("--state-dir", str(tmp_path / f"state-{i}")),
        )
    return shepherd, shepherd_args


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint_every", ["1", "5"])
def test_killed_shepherd_resumes_on_the_same_trajectory(
    e2e: Any, tiny: tuple[str, ...], token_file: Path, tmp_path: Path, checkpoint_every: str
) -> None:
    """kill -9 the shepherd mid-run and start it again with --resume: its workers
    reconnect by themselves, and the run ends with the parameters of an uninterrupted
    run with the same settings. With a checkpoint every 5 rounds (the README's example)
    the resumed shepherd asks again for rounds the workers finished several rounds ago:
    they kept the inner state each started from."""
    settings = ("--steps", "300", "--inner-steps", "10", "--eval-every", "0", *tiny)
    settings += ("--checkpoint-every", checkpoint_every)
    reference = e2e.run_pcp(
        "reference", *DILOCO, "--workers", "2", "--out", str(tmp_path / "ref"), *settings
    )
    assert reference.process.returncode == 0, reference.output()[-3000:]

    out = tmp_path / "run"
    first, shepherd_args = start_supervised_run(e2e, token_file, tmp_path, out, settings)
    e2e.wait_for(lambda: len(e2e.metrics(out)) >= 8, 240, "8 rounds")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    killed_at = len(e2e.metrics(out))
    time.sleep(1)
    resumed = e2e.pcp("resumed", *shepherd_args, "--resume", str(out))
    log = finished(resumed, timeout=400)
    assert "resuming" in log, log[-3000:]

    records = e2e.metrics(out)
    assert [r["round"] for r in records] == list(range(30))
    assert killed_at < 30
    ours = load_file(out / "checkpoint.safetensors")
    theirs = load_file(tmp_path / "ref" / "checkpoint.safetensors")
    for name, array in theirs.items():
        np.testing.assert_allclose(ours[name], array, rtol=1e-6, atol=1e-7, err_msg=name)
    for i in range(2):
        worker_log = (tmp_path / "processes" / f"worker-{i}.err").read_text()
        assert worker_log.count("joined") == 2, worker_log[-3000:]
        assert "inner state restored" in worker_log
        assert "run is no longer the one" not in worker_log, worker_log[-3000:]
