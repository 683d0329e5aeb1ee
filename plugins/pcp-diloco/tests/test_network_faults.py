"""Network faults between hosts with their own addresses (network namespaces, see
netns.py): a cut cable, a partition, a slow and lossy link. The shepherd runs on one
host, each worker on another, as they would across machines.

The slow link is a token bucket (tbf) plus random drops (nftables), not netem: the
kernels here and in CI have no netem."""

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import netns

pytestmark = pytest.mark.serial  # timeouts of seconds on a slowed link

TIMEOUT = "3"  # --worker-timeout and the workers' --timeout, seconds
PORT = 7433


def start_run(
    e2e: Any,
    net: netns.Network,
    tiny: tuple[str, ...],
    token_file: Path,
    out: Path,
    timeout: str = TIMEOUT,
    flags: tuple[str, ...] = (),
) -> None:
    """A shepherd on host 1 and a supervised worker on each other host; returns once
    a round with every worker has finished."""
    shepherd_host, *worker_hosts = net.hosts
    address = f"{shepherd_host.address}:{PORT}"
    python = [sys.executable, "-m", "pcp_core"]
    e2e.start(
        "shepherd",
        net.command(
            shepherd_host,
            [
                *python,
                *("shepherd", "--host", shepherd_host.address, "--port", str(PORT)),
                *("--backend", "cpu", "--workers", str(len(worker_hosts)), "--min-workers", "1"),
                *("--worker-timeout", timeout, "--token-file", str(token_file)),
                *("--steps", "1000000", "--inner-steps", "10", "--eval-every", "0"),
                *("--out", str(out), *tiny, *flags),
            ],
        ),
    )
    for i, host in enumerate(worker_hosts):
        e2e.start(
            f"worker-{i}",
            net.command(
                host,
                [
                    *python,
                    *("worker", "--connect", address, "--token-file", str(token_file)),
                    *("--timeout", timeout, "--state-dir", str(out.parent / f"state-{i}")),
                ],
            ),
        )
    everyone = len(worker_hosts)
    e2e.wait_for(
        lambda: any(r["workers"] == everyone for r in e2e.metrics(out)), 240, "a full round"
    )


def rounds_after(e2e: Any, out: Path, start: int, condition: Callable[[dict], bool]) -> bool:
    return any(condition(record) for record in e2e.metrics(out)[start:])


def shepherd_log(e2e: Any) -> str:
    return (e2e.folder / "shepherd.err").read_text()


def stop_shepherd(e2e: Any) -> None:
    shepherd = e2e.started[0]
    shepherd.process.send_signal(signal.SIGINT)
    assert shepherd.wait(30) == 130, shepherd.output()[-3000:]


def test_cut_and_partition(
    e2e: Any, network: Any, tiny: tuple[str, ...], token_file: Path, tmp_path: Path
) -> None:
    """Cut a worker's cable: the run goes on with the others once the worker timeout
    has passed; heal it: the worker rejoins by itself. Then the same with a partition."""
    net = network(4)  # a shepherd and three workers
    out = tmp_path / "run"
    start_run(e2e, net, tiny, token_file, out)
    victim = net.hosts[3]

    for fault, heal in [
        (lambda: net.cut(victim), lambda: net.heal(victim)),
        (lambda: net.partition([victim]), net.heal_partition),
    ]:
        at = len(e2e.metrics(out))
        fault()
        e2e.wait_for(
            lambda at=at: rounds_after(e2e, out, at, lambda r: r["workers"] == 2),
            30,
            "rounds without the cut-off worker",
        )
        heal()
        at = len(e2e.metrics(out))
        e2e.wait_for(
            lambda at=at: rounds_after(e2e, out, at, lambda r: r["workers"] == 3),
            90,
            "the worker back after healing",
        )
    log = shepherd_log(e2e)
    assert log.count("worker lost") >= 2, log[-4000:]
    stop_shepherd(e2e)


@pytest.mark.alone  # compares round times before and after the throttle
def test_slow_lossy_link(
    e2e: Any,
    network: Any,
    tiny: tuple[str, ...],
    float32_wire: tuple[str, ...],
    token_file: Path,
    tmp_path: Path,
) -> None:
    """One worker's link throttled to 20 Mbit/s with 5% of its packets dropped: its
    rounds take longer, nobody is declared dead, and it stays in every round."""
    if reason := netns.shaping_unavailable():
        netns.skip_or_fail(reason)
    net = network(3)
    out = tmp_path / "run"
    # 5% loss can stall TCP for seconds (retransmit backoff): a realistic timeout
    # float32 both ways: fp4's rounds are too few bytes for 20 Mbit/s to slow them surely
    start_run(e2e, net, tiny, token_file, out, timeout="15", flags=float32_wire)
    fast = [r["round_s"] for r in e2e.metrics(out)[-3:]]
    slow_host = net.hosts[2]
    net.throttle(slow_host, rate_mbit=20)
    net.drop(slow_host, loss_pct=5)
    at = len(e2e.metrics(out)) + 1  # the round in flight may have started before
    e2e.wait_for(lambda: len(e2e.metrics(out)) >= at + 10, 180, "ten rounds over the slow link")
    slow = e2e.metrics(out)[at : at + 10]
    assert all(r["workers"] == 2 for r in slow), slow
    assert min(r["round_s"] for r in slow) > max(fast), (fast, slow)  # the link is slower
    assert "worker lost" not in shepherd_log(e2e)
    net.clear_shaping(slow_host)
    stop_shepherd(e2e)
