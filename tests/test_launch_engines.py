"""`pcp launch` on the real engines: a one-node Slurm cluster (slurmctld, slurmd and
munge from Debian's packages, started here as root) and Open MPI's mpirun.

They skip where the engine or root is missing, and fail when CI is set: CI installs the
packages (scripts/system-deps.sh) and runs as root, so a missing one there is a bug.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_pcp

pytestmark = [pytest.mark.slow, pytest.mark.serial]

# a model small enough that the engines, not the training, take the time
SETTINGS = [
    *("--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32"),
    *("--batch-size", "8", "--eval-every", "0", "--inner-steps", "10"),
]
SLURM_TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scancel", "sinfo")


def require(tools: tuple[str, ...]) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    problem = f"not on PATH: {', '.join(missing)}" if missing else None
    if os.geteuid() != 0:
        problem = "needs root (the engines' daemons and mpirun run as root here)"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"launch engines cannot run in CI: {problem}")
        pytest.skip(problem)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout_s:g} s waiting for {what}")
        time.sleep(0.5)


def processes_naming(text: str) -> list[str]:
    """Command lines of running processes that contain `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found


def ps_output() -> str:
    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A one-node Slurm cluster of this machine; yields the environment its clients need."""
    require(SLURM_TOOLS)
    base = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool", "log"):
        (base / sub).mkdir()
    key = base / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    conf = base / "slurm.conf"
    conf.write_text(
        f"ClusterName=pcptest\nSlurmctldHost={node}(127.0.0.1)\n"
        f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={base}/munge.sock\n"
        f"SlurmUser=root\nSlurmdUser=root\nSlurmctldPort={free_port()}\n"
        f"SlurmdPort={free_port()}\nStateSaveLocation={base}/state\n"
        f"SlurmdSpoolDir={base}/spool\nSlurmctldPidFile={base}/slurmctld.pid\n"
        f"SlurmdPidFile={base}/slurmd.pid\nSlurmctldLogFile={base}/log/slurmctld.log\n"
        f"SlurmdLogFile={base}/log/slurmd.log\nProctrackType=proctrack/linuxproc\n"
        "TaskPlugin=task/none\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
        "MpiDefault=none\nReturnToService=2\nJobAcctGatherType=jobacct_gather/none\n"
        "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN\n"
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
        "OverSubscribe=YES\n"
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [
        [
            *("munged", "--foreground", "--force", f"--socket={base}/munge.sock"),
            *(f"--key-file={key}", f"--pid-file={base}/munged.pid"),
            *(f"--log-file={base}/log/munged.log", f"--seed-file={base}/munge.seed"),
        ],
        ["slurmctld", "-D", "-f", str(conf)],
        ["slurmd", "-D", "-f", str(conf), "-N", node],
    ]
    started = []
    try:
        for argv in daemons:
            started.append(
                subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            )
            time.sleep(0.5)

        def idle() -> bool:
            states = subprocess.run(
                ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True
            ).stdout
            return "idle" in states

        wait_for(idle, 60, "the Slurm node to come up idle")
        yield env
    finally:
        for process in reversed(started):
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def job_running(env: dict[str, str], job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True)
    return bool(out.stdout.strip())


def test_slurm_runs_a_job_that_scancel_stops_clean_and_a_resubmission_finishes(
    slurm: dict[str, str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "job"
    launched = run_pcp(
        *("launch", "slurm", "--workers", "2", "--run-dir", str(run_dir)),
        *("--port", str(free_port()), "-o", "shepherd-host=127.0.0.1"),
        *("--", *SETTINGS, "--steps", "2000"),
        env=slurm,
    )
    assert launched.returncode == 0, launched.stdout + launched.stderr
    job = re.search(r"^(\d+)$", launched.stdout, re.MULTILINE).group(1)
    secret = (run_dir / "token").read_text().strip()
    checkpoint = run_dir / "shepherd" / "checkpoint.safetensors"
    seen = []

    def rounds_past_a_checkpoint() -> bool:
        seen.append(ps_output())
        metrics = run_dir / "shepherd" / "metrics.jsonl"
        return checkpoint.exists() and metrics.exists() and metrics.read_text().count("\n") >= 5

    wait_for(rounds_past_a_checkpoint, 300, "five rounds and a checkpoint")
    subprocess.run(["scancel", job], env=slurm, check=True)
    wait_for(lambda: not job_running(slurm, job), 60, "scancel to end the job")
    left = [str(run_dir), f"job{int(job):05d}/slurm_script"]
    wait_for(lambda: not any(map(processes_naming, left)), 30, "no process left of the job")

    resubmitted = subprocess.run(
        ["sbatch", "--parsable", "pcp.sbatch"],
        cwd=run_dir,
        env=slurm,
        capture_output=True,
        text=True,
    )
    assert resubmitted.returncode == 0, resubmitted.stderr
    again = resubmitted.stdout.strip().split(";")[0]

    def finished() -> bool:
        seen.append(ps_output())
        return not job_running(slurm, again)

    wait_for(finished, 600, "the resubmitted job to finish")
    log = (run_dir / "shepherd.log").read_text()
    assert re.search(r"resuming.*round", log), log[-2000:]
    summary = json.loads((run_dir / "shepherd" / "summary.json").read_text())
    assert summary["rounds"] == 200, summary["rounds"]
    wait_for(lambda: not processes_naming(str(run_dir)), 30, "the finished job's processes to end")
    assert not processes_naming(f"job{int(again):05d}/slurm_script")
    for text in [*seen, launched.stdout, launched.stderr]:
        assert secret not in text
    for path in run_dir.iterdir():
        if path.is_file() and path.name != "token":
            assert secret not in path.read_text(errors="replace"), path.name


def test_mpirun_starts_the_workers_of_pcp_launch_mpi_each_picks_a_backend_and_they_train(
    tmp_path: Path,
) -> None:
    require(("mpirun",))
    run_dir = tmp_path / "job"
    launched = run_pcp(
        *("launch", "mpi", "--workers", "2", "--run-dir", str(run_dir)),
        *("--port", str(free_port()), "-o", "shepherd-host=127.0.0.1"),
        *("-o", "mpirun-args=--oversubscribe", "--worker-args", "--backend auto"),
        *("--", *SETTINGS, "--steps", "40"),
        env={
            **{"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"},
            "PCP_LOG_FORMAT": "json",
        },
    )
    assert launched.returncode == 0, launched.stdout + launched.stderr
    summary = json.loads((run_dir / "shepherd" / "summary.json").read_text())
    assert summary["rounds"] == 4
    lines = (run_dir / "workers.log").read_text().splitlines()
    ranks = [json.loads(line) for line in lines if '"job rank"' in line]
    assert sorted(r["rank"] for r in ranks) == [0, 1], lines[-20:]
    assert sum('"backend chosen"' in line for line in lines) >= 2  # --backend auto
    secret = (run_dir / "token").read_text().strip()
    for path in run_dir.iterdir():
        if path.is_file() and path.name != "token":
            assert secret not in path.read_text(errors="replace"), path.name
