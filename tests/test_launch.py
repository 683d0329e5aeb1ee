"""`pcp launch`: the launchers' plans, the secret's handling and bad input, without an
engine (tests/test_launch_engines.py runs them on real Slurm and Open MPI)."""

import json
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

from pcp_core.launch.ranks import Rank, device_for, job_rank
from pcp_core.testing import LauncherConformance
from tests.conftest import run_pcp

SETTINGS = ["--steps", "40", "--inner-steps", "10"]


class TestSlurmLauncher(LauncherConformance):
    launcher_name = "slurm"


class TestMpiLauncher(LauncherConformance):
    launcher_name = "mpi"


class TestKubernetesLauncher(LauncherConformance):
    launcher_name = "kubernetes"
    options: ClassVar[dict[str, str]] = {"image": "registry.example/pcp:0.1"}


def test_the_kubernetes_manifests_validate_against_the_schema(tmp_path: Path) -> None:
    import kubernetes_validate

    run_dir = tmp_path / "k8s run"
    result = run_pcp(
        *("launch", "kubernetes", "--workers", "3", "--run-dir", str(run_dir), "--dry-run"),
        *("-o", "image=registry.example/pcp:0.1", "-o", "gpus-per-worker=1"),
        *("-o", "run-claim=pcp-runs", "--worker-args", "--backend xla", "--", *SETTINGS),
    )
    assert result.returncode == 0, result.stderr
    manifests = json.loads((run_dir / "kubernetes.json").read_text())
    kinds = [item["kind"] for item in manifests["items"]]
    assert kinds == ["Service", "Deployment", "Job"]
    for item in manifests["items"]:
        kubernetes_validate.validate(item, "1.30.0", strict=True)
    _, deployment, job = manifests["items"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["volumes"][0]["secret"]["defaultMode"] == 0o400
    assert pod["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert job["spec"]["completions"] == 3 and job["spec"]["completionMode"] == "Indexed"
    worker = job["spec"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert "pcp-k8s-run-shepherd:7433" in worker["command"] and "xla" in worker["command"]
    secret = (run_dir / "token").read_text().strip()
    apply = (run_dir / "apply.sh").read_text()
    assert "--from-file=token=" in apply and secret not in apply


def test_kubernetes_needs_an_image(tmp_path: Path) -> None:
    result = run_pcp(
        "launch", "kubernetes", "--workers", "2", "--run-dir", str(tmp_path), "--dry-run"
    )
    assert result.returncode == 2 and "needs -o image=IMAGE" in result.stderr


def test_a_dry_run_writes_an_owner_only_script_and_a_secret_only_in_the_token(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "job"
    result = run_pcp(
        *("launch", "slurm", "--workers", "2", "--run-dir", str(run_dir), "--dry-run"),
        *("-o", "partition=gpu", "-o", "gpus-per-task=1", "--worker-args", "--backend xla"),
        *("--", *SETTINGS),
    )
    assert result.returncode == 0, result.stderr
    assert "sbatch --parsable pcp.sbatch" in result.stdout
    script = (run_dir / "pcp.sbatch").read_text()
    assert "#SBATCH --partition=gpu" in script and "--gpus-per-task=1" in script
    assert "--steps 40 --inner-steps 10" in script and "--backend xla" in script
    secret = (run_dir / "token").read_text().strip()
    assert stat.S_IMODE((run_dir / "token").stat().st_mode) == 0o600
    assert stat.S_IMODE((run_dir / "pcp.sbatch").stat().st_mode) == 0o700
    for path in run_dir.iterdir():
        assert path.name == "token" or secret not in path.read_text(), path.name
    assert secret not in result.stdout + result.stderr
    record = json.loads((run_dir / "launch.json").read_text())
    assert record["launcher"] == "slurm" and record["workers"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["slurm", "--workers", "0"], "--workers must be at least 1"),
        (["slurm", "--workers", "2", "--port", "70000"], "--port must be from 1 to 65535"),
        (["slurm", "--workers", "2", "-o", "colour=red"], "takes no option colour"),
        (["slurm", "--workers", "2", "-o", "nodes=two"], "nodes must be a positive whole"),
        (["slurm", "--workers", "2", "-o", "partition"], "--option must be KEY=VALUE"),
        (["mpi", "--workers", "2", "-o", "mpirun-args='x"], "mpirun-args"),
        (["ssh", "--workers", "2"], "ssh"),
        (["slurm"], "give a LAUNCHER and --workers"),
        (["slurm", "--workers", "2", "--", "--token-file", "t"], "--token-file is set by"),
        (["mpi", "--workers", "2", "--", "--port=9000"], "--port is pcp launch's own"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_pcp("launch", *args, "--run-dir", str(tmp_path / "r"), "--dry-run")
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_run_directory_that_holds_a_launched_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "shepherd").mkdir()
    (tmp_path / "shepherd" / "config.toml").write_text("")
    result = run_pcp("launch", "mpi", "--workers", "2", "--run-dir", str(tmp_path), "--dry-run")
    assert result.returncode == 2 and "already holds a launched run" in result.stderr


def test_submitting_without_the_engine_says_what_is_missing(tmp_path: Path) -> None:
    result = run_pcp(
        "launch", "slurm", "--workers", "2", "--run-dir", str(tmp_path), env={"PATH": "/none"}
    )
    assert result.returncode == 2 and "sbatch is not on PATH" in result.stderr


def test_the_list_shows_every_launcher_and_its_options() -> None:
    result = run_pcp("launch", "--list")
    assert result.returncode == 0
    assert "slurm:" in result.stdout and "mpi:" in result.stdout
    assert "-o gpus-per-task=" in result.stdout and "-o hostfile=" in result.stdout


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        (
            {
                "OMPI_COMM_WORLD_RANK": "3",
                "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_SIZE": "4",
            },
            Rank(3, 1, 4, "OMPI_COMM_WORLD_RANK"),
        ),
        ({"PMI_RANK": "2", "PMI_SIZE": "8", "MPI_LOCALRANKID": "0"}, Rank(2, 0, 8, "PMI_RANK")),
        ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1"}, Rank(5, 1, None, "SLURM_PROCID")),
        ({"OMPI_COMM_WORLD_RANK": "x"}, None),
    ],
)
def test_a_workers_rank_comes_from_the_mpi_or_slurm_environment(
    environ: dict[str, str], expected: Rank | None
) -> None:
    assert job_rank(environ) == expected


def test_a_rank_takes_its_device_on_the_node_only_where_there_are_several() -> None:
    rank = Rank(rank=5, local_rank=3, size=8, source="SLURM_PROCID")
    assert device_for(rank, 4) == 3 and device_for(rank, 2) == 1
    assert device_for(rank, 1) is None and device_for(None, 8) is None


def test_a_sigterm_to_pcp_launch_reaches_the_job_it_runs(tmp_path: Path) -> None:
    """A launcher whose submit runs the job in the foreground (mpi, ray) stops the job
    when `pcp launch` is stopped, instead of leaving it running without its parent."""
    job = "trap 'echo stopped > stopped; exit 3' TERM; touch started; sleep 60 & wait"
    code = (
        "import sys; from pathlib import Path\n"
        "from pcp_core.launch.prepare import submit\n"
        "from pcp_core.launchers import LaunchPlan, LaunchRequest\n"
        f"request = LaunchRequest(Path({str(tmp_path)!r}), Path('token'), 1, 7070, 'python')\n"
        f"sys.exit(submit(LaunchPlan({{}}, ('bash', '-c', {job!r})), request))\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(30) == 3
    assert (tmp_path / "stopped").read_text() == "stopped\n"
