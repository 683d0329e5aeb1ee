"""`pcp launch ray`: the plan, the conformance suite, and real runs on a local Ray
cluster of three nodes (Ray's own `Cluster` test utility: a head for the shepherd and
two nodes for the workers, each a raylet of its own on this machine)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pcp_ray.launcher import PLAN, RAY, SHEPHERD_ADDRESS

from pcp_core.launchers import LaunchError
from pcp_core.testing.launcher_suite import LauncherConformance

# a model small enough that Ray, not the training, takes the time
SETTINGS = [
    *("--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32"),
    *("--batch-size", "8", "--eval-every", "0"),
]


class TestRayLauncher(LauncherConformance):
    launcher_name = "ray"


def plan_for(tmp_path: Path, **options: str) -> dict:
    from pcp_core.launch.prepare import build_request

    request = build_request(RAY, tmp_path / "run", 3, 7171, "python", ["--steps", "9"], [], options)
    return json.loads(RAY.plan(request).files[PLAN])


def test_the_plan_names_the_commands_and_the_resources(tmp_path: Path) -> None:
    plan = plan_for(
        tmp_path,
        **{"worker-resources": "rocm=1, big=0.5", "gpus-per-worker": "1", "max-restarts": "-1"},
    )
    assert plan["workers"] == 3 and plan["max_restarts"] == -1
    assert plan["worker_resources"] == {"rocm": 1.0, "big": 0.5}
    assert plan["gpus_per_worker"] == 1.0 and plan["cpus_per_worker"] == 1.0
    assert f"{SHEPHERD_ADDRESS}:7171" in plan["worker"]
    assert plan["shepherd"][-2:] == ["--steps", "9"] and plan["address"] == "auto"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("worker-resources", "rocm"),
        ("worker-resources", "rocm=0"),
        ("shepherd-resources", "=1"),
        ("gpus-per-worker", "-1"),
        ("cpus-per-worker", "many"),
        ("max-restarts", "1.5"),
        ("max-restarts", "-2"),
    ],
)
def test_bad_options_are_refused_by_name(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(LaunchError, match=f"ray option {key}"):
        plan_for(tmp_path, **{key: value})


def test_the_driver_says_what_is_wrong_with_its_plan(tmp_path: Path) -> None:
    driver = [sys.executable, "-m", "pcp_ray.driver"]
    missing = subprocess.run([*driver, str(tmp_path / "none.json")], capture_output=True, text=True)
    assert missing.returncode == 2 and "cannot read the plan" in missing.stderr
    assert subprocess.run(driver, capture_output=True, text=True).returncode == 2


# --- real runs on a local Ray cluster ---


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout_s:g} s waiting for {what}")
        time.sleep(0.5)


def command_lines() -> list[str]:
    """Every running process's command line."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # ended while we looked
    return found


def pcp_processes(run_dir: Path) -> list[str]:
    return [line for line in command_lines() if str(run_dir / "token") in line]


def count(path: Path, text: str) -> int:
    return path.read_text().count(text) if path.exists() else 0


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """Three Ray nodes on this machine: the head (resource pcp_shepherd) and two with one
    pcp_worker each; the cluster's address."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the processes' parent-death signal is Linux's")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"pcp_shepherd": 1}}
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, resources={"pcp_worker": 1})
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def launch(
    cluster: str, run_dir: Path, steps: int, inner_steps: int = 10, *train_flags: str
) -> subprocess.Popen:
    """`pcp launch ray` of a two-worker DiLoCo run, running (the driver in the foreground)."""
    command = [
        *(sys.executable, "-m", "pcp_core", "launch", "ray", "--workers", "2"),
        *("--run-dir", str(run_dir), "--port", str(free_port()), "-o", f"address={cluster}"),
        *("-o", "shepherd-resources=pcp_shepherd=1", "-o", "worker-resources=pcp_worker=1"),
        *("--", *SETTINGS, "--steps", str(steps), "--inner-steps", str(inner_steps)),
        *train_flags,
    ]
    env = {**os.environ, "PCP_LOG_FORMAT": "json"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def rounds_done(run_dir: Path) -> int:
    return count(run_dir / "shepherd" / "metrics.jsonl", '"round"')


def events(log: Path, lines: int = 25) -> str:
    """The end of a run's log without the workers' per-round states, which would hide
    the joins, losses and errors."""
    kept = [
        line for line in log.read_text(errors="replace").splitlines() if "worker state" not in line
    ]
    return "\n".join(kept[-lines:])


@contextmanager
def driving(driver: subprocess.Popen, run_dir: Path) -> Iterator[None]:
    """While the test drives the run: a failure carries the end of every log of the run,
    and the driver is stopped after, however the test ended."""
    try:
        yield
    except (AssertionError, subprocess.TimeoutExpired) as error:
        tails = [
            f"--- the last events of {path.name}:\n{events(path)}"
            for path in sorted(run_dir.glob("*.log"))
        ]
        raise AssertionError("\n".join([str(error), *tails])) from error
    finally:
        stop(driver)


def stop(driver: subprocess.Popen) -> None:
    """End the driver as a user would, by SIGTERM, on which it ends the run's actors; a
    killed driver's actors can outlive it and hold the cluster's worker resources from the
    next test. SIGKILL if it has not ended in a minute."""
    if driver.poll() is None:
        driver.send_signal(signal.SIGTERM)
        try:
            driver.communicate(timeout=60)  # read, so that a full pipe cannot hold it
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.communicate()


@pytest.mark.slow
def test_a_killed_worker_actor_is_restarted_by_ray_and_rejoins_and_the_run_ends(
    cluster: str, tmp_path: Path
) -> None:
    import ray

    run_dir = tmp_path / "run"
    # every round needs both workers' results, so the run waits for the restarted worker
    # however slow Ray's restart is (one worker alone finished the run first: 400 rounds
    # take about 16 s)
    driver = launch(cluster, run_dir, 4000, 10, "--min-workers", "2")
    shepherd_log = run_dir / "shepherd.log"
    with driving(driver, run_dir):
        wait_for(lambda: rounds_done(run_dir) >= 5, 180, "five rounds")
        secret = (run_dir / "token").read_text().strip()
        assert not [line for line in command_lines() if secret in line]
        plan = json.loads((run_dir / PLAN).read_text())
        ray.init(address=cluster, namespace=plan["namespace"])
        try:
            ray.kill(ray.get_actor("worker-0"), no_restart=False)  # Ray restarts it
        finally:
            ray.shutdown()
        wait_for(lambda: count(shepherd_log, "worker lost") >= 1, 60, "the shepherd to see it")
        wait_for(lambda: count(shepherd_log, "worker joined") >= 3, 120, "the worker to rejoin")
        output, _ = driver.communicate(timeout=300)
    assert driver.returncode == 0, output.decode()[-3000:]
    summary = json.loads((run_dir / "shepherd" / "summary.json").read_text())
    assert summary["rounds"] == 400
    assert count(run_dir / "worker-0.log", '"joined"') == 2  # the first worker, then the new
    assert pcp_processes(run_dir) == [], "the run left processes behind"
    for path in run_dir.iterdir():
        if path.is_file() and path.name != "token":
            assert secret not in path.read_text(errors="replace"), path.name


@pytest.mark.slow
def test_sigterm_stops_every_process_and_running_the_driver_again_resumes(
    cluster: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    driver = launch(cluster, run_dir, steps=4000, inner_steps=100)  # 40 rounds of a second
    checkpoint = run_dir / "shepherd" / "checkpoint.safetensors"
    with driving(driver, run_dir):
        wait_for(lambda: checkpoint.exists() and rounds_done(run_dir) >= 3, 180, "a checkpoint")
        driver.send_signal(signal.SIGTERM)
        output, _ = driver.communicate(timeout=60)
    assert driver.returncode != 0 and b"SIGTERM: the run's actors are stopped" in output, output
    wait_for(lambda: pcp_processes(run_dir) == [], 30, "the run's processes to end")
    resumed = subprocess.run(
        [sys.executable, "-m", "pcp_ray.driver", PLAN],
        cwd=run_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    resuming = re.search(r"resuming +round=(\d+)", (run_dir / "shepherd.log").read_text())
    assert resuming and 0 < int(resuming.group(1)) < 40  # stopped mid-run, resumed there
    assert json.loads((run_dir / "shepherd" / "summary.json").read_text())["rounds"] == 40
    assert pcp_processes(run_dir) == []
