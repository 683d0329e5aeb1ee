"""The WAN rehearsal's links: scenario files, and real namespaces that keep their numbers.

The loader tests are fast and need nothing. The link tests build namespaces for real
(root, Linux, ip/tc/nft): they skip where those are missing, and fail when CI is set,
since CI runs as root and a missing kernel feature there is a bug to see.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from statistics import median

import pytest

from pcp_core.rehearsal.scenario import Link, Scenario, ScenarioError, Worker, load_scenario

ROOT = Path(__file__).resolve().parents[1]

VALID = """
name = "t"
[shepherd]
rate_mbit = 1000
[[workers]]
name = "far"
count = 3
rate_mbit = 20
delay_ms = 150
jitter_ms = 10
loss_percent = 0.5
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_worker_group_is_repeated_count_times(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, VALID))
    assert [w.name for w in scenario.workers] == ["far-0", "far-1", "far-2"]
    assert scenario.workers[0].link == Link(20, 150, 10, 0.5)
    assert scenario.workers[0].backend == "cpu"
    assert scenario.shepherd == Link(1000)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("rate_mbit = 20", "rate_mbit = 0"), "workers[0].rate_mbit: must be > 0"),
        (("rate_mbit = 20", "rate_mbit = -5"), "workers[0].rate_mbit: must be > 0"),
        (("rate_mbit = 20", 'rate_mbit = "fast"'), "workers[0].rate_mbit: expected a number"),
        (("rate_mbit = 20\n", ""), "workers[0].rate_mbit: missing"),
        (("delay_ms = 150", "delay_ms = -1"), "workers[0].delay_ms: must be >= 0"),
        (("jitter_ms = 10", "jitter_ms = 200"), "workers[0].jitter_ms: must be between 0 and"),
        (("loss_percent = 0.5", "loss_percent = 100"), "workers[0].loss_percent: must be >= 0"),
        (("loss_percent = 0.5", "loss_percent = -1"), "workers[0].loss_percent: must be >= 0"),
        (("loss_percent = 0.5", "los_percent = 0.5"), "workers[0].los_percent: unknown key"),
        (("count = 3", "count = 0"), "workers[0].count: expected an integer >= 1"),
        (("count = 3", "count = 3\ncpus = 0"), "workers[0].cpus: expected a number of cores"),
        (("count = 3", 'count = 3\ncpus = "half"'), "workers[0].cpus: expected a number"),
        (('name = "far"', 'name = "Far Away"'), "workers[0].name: must be lowercase"),
        (('name = "far"\ncount = 3', 'name = "router"'), "names must be unique"),
        (("rate_mbit = 1000", "rate_mbit = 0"), "shepherd.rate_mbit: must be > 0"),
        (("[shepherd]\nrate_mbit = 1000\n", ""), "shepherd: missing table"),
        (('name = "t"', 'nme = "t"'), "nme: unknown key"),
    ],
)
def test_a_bad_scenario_fails_with_one_line_naming_the_key(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    text = VALID.replace(*change, 1)
    assert text != VALID
    with pytest.raises(ScenarioError) as error:
        load_scenario(write(tmp_path, text))
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_no_workers_and_bad_toml_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="workers: missing"):
        load_scenario(write(tmp_path, "[shepherd]\nrate_mbit = 1\n"))
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(write(tmp_path, "[shepherd\n"))
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")


def test_the_committed_scenarios_load() -> None:
    lan = load_scenario(ROOT / "scenarios" / "lan.toml")
    planet = load_scenario(ROOT / "scenarios" / "mixed-planet.toml")
    thin = load_scenario(ROOT / "scenarios" / "thin.toml")
    unequal = load_scenario(ROOT / "scenarios" / "unequal.toml")
    assert [w.cpus for w in unequal.workers] == [0.25, 0.5, 1.0]
    control = load_scenario(ROOT / "scenarios" / "equal3.toml")  # unequal's, at one speed
    assert [w.cpus for w in control.workers] == [0.58] * 3
    assert [w.link for w in control.workers] == [w.link for w in unequal.workers]
    assert all(w.cpus is None for w in lan.workers)
    assert len(lan.workers) >= 2
    links = sorted((w.link.rate_mbit, w.link.delay_ms, w.link.loss_percent) for w in planet.workers)
    assert links == [(20, 150, 0.5)] * 2 + [(100, 40, 0)] * 4 + [(1000, 10, 0)] * 2
    assert planet.shepherd.rate_mbit <= 1000
    assert all(w.link.rate_mbit <= 20 for w in thin.workers)


# ---- real links ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def netns_ready() -> None:
    """Skip without root and `ip netns`; fail instead when CI is set."""
    from pcp_core.rehearsal.links import requirements_problem

    problem = requirements_problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"the WAN rehearsal cannot run in CI: {problem}")
        pytest.skip(problem)


SMALL = Scenario(
    name="test",
    shepherd=Link(rate_mbit=1000),
    workers=[
        Worker("slow", Link(rate_mbit=20, delay_ms=20)),
        Worker("lossy", Link(rate_mbit=1000, loss_percent=5)),
    ],
)


@pytest.fixture(scope="module")
def network(netns_ready: None):
    from pcp_core.rehearsal.links import emulated_network

    with emulated_network(SMALL) as net:
        yield net


@pytest.mark.slow
def test_a_link_delivers_its_round_trip_time(network) -> None:
    from pcp_core.rehearsal.probe import measure_rtt

    answer = measure_rtt(network, "slow", "shepherd", count=20)
    rtt = median(answer["rtt_ms"])
    assert 40 * 0.9 <= rtt <= 40 * 1.1, answer
    # The handshake's round trip comes before the first exchange's.
    assert answer["first_exchange_ms"] >= 2 * 40 * 0.9, answer


@pytest.mark.slow
@pytest.mark.parametrize(("sender", "receiver"), [("slow", "shepherd"), ("shepherd", "slow")])
def test_a_link_delivers_its_rate(network, sender: str, receiver: str) -> None:
    from pcp_core.rehearsal.probe import measure_rate

    mbit = measure_rate(network, sender, receiver, seconds=3.0, warmup=1.0)
    # TCP goodput: the wire rate less the headers (about 4.4%).
    assert 20 * 0.9 <= mbit <= 20 * 1.1, mbit


def _best_of_three(network, sender: str, low: float, high: float):
    """Measure `sender`'s loss to the shepherd until the end-to-end share is in
    [low, high], at most three times; every measure. A busy host loses datagrams of its
    own, which only add to the link's: CI once saw 10.9% on a quiet 5% link."""
    from pcp_core.rehearsal.probe import measure_loss

    measures = []
    for _ in range(3):
        measures.append(measure_loss(network, sender, "shepherd", count=4000, rate=2000))
        if low <= measures[-1].share <= high:
            break
    return measures


@pytest.mark.slow
@pytest.mark.alone  # a probe starved of CPU by parallel tests loses packets to the host
def test_a_link_drops_its_share_of_packets(network) -> None:
    measures = _best_of_three(network, "lossy", 0.025, 0.08)
    # The rule itself: 5% of 4000 judged packets, a binomial sd of 0.34 points.
    assert all(0.035 <= m.link_share <= 0.065 for m in measures), measures
    assert 0.025 <= measures[-1].share <= 0.08, measures
    clean = _best_of_three(network, "slow", 0.0, 0.01)
    assert all(m.judged == m.dropped == 0 for m in clean), clean
    assert clean[-1].share <= 0.01, clean


@pytest.mark.slow
def test_teardown_leaves_nothing_even_after_an_exception(netns_ready: None) -> None:
    from pcp_core.rehearsal.links import emulated_network, list_namespaces

    with pytest.raises(RuntimeError, match="boom"), emulated_network(SMALL) as net:
        names = list(net.namespaces)
        assert set(names) <= set(list_namespaces())
        raise RuntimeError("boom")
    assert not set(names) & set(list_namespaces())


CHILD = """
import sys, time
from pcp_core.rehearsal.links import emulated_network
from pcp_core.rehearsal.scenario import Link, Scenario, Worker
scenario = Scenario("child", Link(100), [Worker("w", Link(10, delay_ms=5))])
with emulated_network(scenario) as net:
    print("namespaces", *net.namespaces, flush=True)
    time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_stopped_run_leaves_nothing_behind(netns_ready: None, how: signal.Signals) -> None:
    """SIGTERM and Ctrl-C tear down at once; after SIGKILL the next run's cleanup does."""
    from pcp_core.rehearsal.links import cleanup_stale, list_namespaces

    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("namespaces"):
            line = child.stdout.readline()
            assert line or child.poll() is None, "the child ended before its network was up"
        names = line.split()[1:]
        assert len(names) == 3, names
        child.send_signal(how)
        child.wait(30)
    finally:
        child.kill()
        child.wait()
    if how == signal.SIGKILL:
        assert set(names) <= set(list_namespaces())
        time.sleep(0.1)
        assert set(names) <= set(cleanup_stale())
    assert not set(names) & set(list_namespaces())
