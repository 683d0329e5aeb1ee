"""Processes come and go: Ctrl-C ends a whole one-command run, a killed worker comes back,
a worker that joins too late is still stopped."""

import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.serial  # restarts with backoff, a join in the last round

DILOCO = ("train", "--algorithm", "diloco", "--backend", "cpu", "--workers", "2")


def start_run(e2e: Any, tiny: tuple[str, ...], out: Path, steps: int) -> tuple[Any, str]:
    """Start a one-command run in its own session; return it and the shepherd's address
    once the first round is done."""
    run = e2e.pcp(
        "train",
        *DILOCO,
        *("--steps", str(steps), "--inner-steps", "10", "--eval-every", "0", "--out", str(out)),
        *tiny,
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )
    e2e.wait_for(lambda: e2e.metrics(out) or run.process.poll() is not None, 180, "the first round")
    assert run.process.poll() is None, run.output()[-4000:]
    port = e2e.listening_port(run)
    assert port is not None, run.err()
    address = f"127.0.0.1:{port}"
    e2e.own(address)
    return run, address


def ends_on_ctrl_c(run: Any, within_s: float, group: bool = True) -> None:
    """SIGINT to the run's process group (a terminal's Ctrl-C), or to `pcp train` alone:
    it exits 130 within `within_s`."""
    if group:
        os.killpg(run.pid, signal.SIGINT)
    else:
        os.kill(run.pid, signal.SIGINT)
    try:
        code = run.wait(within_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`pcp train` still running {within_s} s after SIGINT:\n{run.err()[-3000:]}")
    assert code == 130, run.err()[-3000:]


def worker_pids(e2e: Any, address: str) -> list[int]:
    return e2e.pids_with(f"pcp_core worker --connect {address}")


@pytest.mark.parametrize("to", ["group", "parent"])
def test_ctrl_c_ends_everything(e2e: Any, tiny: tuple[str, ...], tmp_path: Path, to: str) -> None:
    """SIGINT to the process group (a terminal's Ctrl-C) or to `pcp train` alone: it exits
    130 within seconds, takes its workers with it and frees its port."""
    run, address = start_run(e2e, tiny, tmp_path / "run", steps=100_000)
    assert len(worker_pids(e2e, address)) == 2
    ends_on_ctrl_c(run, within_s=20, group=to == "group")
    assert "interrupted" in run.err()
    assert e2e.pids_with(address) == [], "a worker outlived Ctrl-C"
    host, port = address.split(":")
    with socket.create_server((host, int(port))):  # a new shepherd could listen there
        pass


def test_ctrl_c_while_compiling_for_the_workers(
    e2e: Any, tiny: tuple[str, ...], tmp_path: Path
) -> None:
    """Ctrl-C while the shepherd compiles its joining workers' program: exit 130, and
    the compiler (in a session of its own, out of the terminal's reach) ends with it."""
    cache = tmp_path / "empty-cache"  # nothing cached: the join compiles
    run = e2e.pcp(
        "train",
        *DILOCO,
        *("--steps", "100000", "--inner-steps", "10", "--eval-every", "0"),
        *("--out", str(tmp_path / "run"), *tiny),
        start_new_session=True,
        env={**os.environ, "PCP_CACHE_DIR": str(cache)},
    )
    e2e.wait_for(
        lambda: "compiling with IREE" in run.err() or run.process.poll() is not None,
        180,
        "the compile for the workers",
    )
    assert run.process.poll() is None, run.output()[-4000:]
    ends_on_ctrl_c(run, within_s=30)
    assert compilers_using(cache) == [], "a process of the run (its compiler?) outlived it"


def compilers_using(cache: Path) -> list[int]:
    """Live processes whose environment names `cache` as PCP_CACHE_DIR."""
    marker = f"PCP_CACHE_DIR={cache}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in environment and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def test_local_workers_get_the_device(e2e: Any, tiny: tuple[str, ...], tmp_path: Path) -> None:
    """`pcp train --workers 2 --device 0`: each local worker is started on that device."""
    run = e2e.pcp(
        "train",
        *DILOCO,
        *("--device", "0", "--steps", "100000", "--inner-steps", "10", "--eval-every", "0"),
        *("--out", str(tmp_path / "run"), *tiny),
        start_new_session=True,
    )
    port = e2e.wait_for(
        lambda: e2e.listening_port(run) or run.process.poll() is not None, 180, "the shepherd"
    )
    assert run.process.poll() is None, run.output()[-4000:]
    address = f"127.0.0.1:{port}"
    e2e.own(address)
    e2e.wait_for(lambda: len(worker_pids(e2e, address)) == 2, 60, "two local workers")
    for pid in worker_pids(e2e, address):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        assert "--device" in argv and argv[argv.index("--device") + 1] == "0", argv
    ends_on_ctrl_c(run, within_s=30)


@pytest.mark.slow
def test_killed_worker_is_restarted_and_rejoins(
    e2e: Any, tiny: tuple[str, ...], tmp_path: Path
) -> None:
    """SIGKILL one worker mid-run: its supervisor restarts it, it joins again, the run ends."""
    out = tmp_path / "run"
    # 160 rounds, about 25 s here: a restart and rejoin took 2.2 s
    run, address = start_run(e2e, tiny, out, steps=1600)
    pids = worker_pids(e2e, address)
    assert len(pids) == 2
    killed_after = len(e2e.metrics(out))
    os.kill(pids[0], signal.SIGKILL)
    try:
        code = run.wait(300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not finish:\n{run.err()[-3000:]}")
    assert code == 0, run.err()[-3000:]
    assert e2e.pids_with(address) == []

    records = e2e.metrics(out)
    assert len(records) == 160
    workers = [r["workers"] for r in records]
    lost = workers.index(1, killed_after)  # the round that went on without it
    assert 2 in workers[lost:], "the restarted worker never took part again"
    assert "worker crashed; restarting" in run.err() and "code=-9" in run.err()
    # the shepherd's account of it, as the dashboard and /status show it
    assert "state=dead" in run.err() and "state=restarting" in run.err(), run.err()[-3000:]
    logs = [(out / f"worker-{i}.log").read_text() for i in range(2)]
    assert sorted(log.count("joined") for log in logs) == [1, 2], logs
    assert all(log.count("reason=done") == 1 for log in logs), logs
    restarted = next(log for log in logs if log.count("joined") == 2)
    assert "inner state restored" in restarted, restarted  # it resumed, not started over


def test_worker_joining_during_the_last_round_is_stopped(
    e2e: Any, tiny: tuple[str, ...], token_file: Path, tmp_path: Path
) -> None:
    """A worker that joins too late to take part is still told to stop, and exits cleanly.

    Two workers start together for a run that needs one: the second to join arrives
    while the only round runs or while the shepherd evaluates after it (or, joining
    before the round starts, takes part instead), and ends the same way. Starting them
    together keeps the late one from arriving after the shepherd has gone.
    """
    port = e2e.free_port()
    address = f"127.0.0.1:{port}"
    e2e.own(address)
    shepherd = e2e.pcp(
        "shepherd",
        "shepherd",
        *("--backend", "cpu", "--workers", "1", "--port", str(port)),
        *("--token-file", str(token_file), "--steps", "60", "--inner-steps", "60"),
        *("--eval-every", "0", "--out", str(tmp_path / "run"), *tiny),
    )
    worker_args = ("worker", "--connect", address, "--token-file", str(token_file))
    workers = [e2e.pcp(f"worker-{i}", *worker_args, "--restarts", "0") for i in range(2)]
    assert shepherd.wait(120) == 0, shepherd.output()[-4000:]
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()
        assert "lost the shepherd" not in worker.err()
    assert all("stopping" in worker.err() for worker in workers)  # each was told to stop
