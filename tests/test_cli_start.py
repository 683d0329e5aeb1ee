"""What `pcp shepherd`, `pcp train` and `pcp worker` refuse at the start: one line, exit 2."""

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_pcp


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-1", "0.001", "1e308"])
def test_worker_timeout_must_be_a_positive_number(timeout: str) -> None:
    result = run_pcp("worker", "--connect", "127.0.0.1:9", "--timeout", timeout)
    assert result.returncode == 2, result.stderr
    assert "--timeout must be from 1 to 604800 seconds" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.fixture
def no_jax(tmp_path: Path) -> dict[str, str]:
    """An environment in which importing jax fails: a check that passes there ran before
    the program was built."""
    fake = tmp_path / "no-jax" / "jax"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('jax imported before the checks')\n")
    path = os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "PCP_TOKEN": ""}


def private_token(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    path.chmod(mode)
    return path


def busy_port() -> tuple[socket.socket, int]:
    listener = socket.create_server(("127.0.0.1", 0))
    return listener, listener.getsockname()[1]


CASES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "non-loopback without a secret": (
        lambda tmp: ["shepherd", "--host", "0.0.0.0"],
        "refusing to listen on 0.0.0.0 without a secret: pass --issuer-key FILE",
    ),
    "missing token file": (
        lambda tmp: ["shepherd", "--token-file", str(tmp / "missing")],
        "cannot read token file {tmp}/missing: No such file or directory",
    ),
    "token file open to others": (
        lambda tmp: ["shepherd", "--token-file", str(private_token(tmp, 0o644))],
        "token file {tmp}/token has mode 0644, so its group or others may read or write it; "
        "run `chmod 600 {tmp}/token`",
    ),
    "missing TLS certificate": (
        lambda tmp: ["shepherd", "--tls-cert", str(tmp / "c.pem"), "--tls-key", str(tmp / "k")],
        "--tls-cert {tmp}/c.pem: no such file",
    ),
    "missing TLS CA of the local workers": (
        lambda tmp: ["train", "--algorithm", "diloco", "--tls-ca", str(tmp / "ca.pem")],
        "--tls-ca {tmp}/ca.pem: no such file",
    ),
    "TLS files that are no key pair": (
        lambda tmp: [
            "shepherd",
            *("--tls-cert", str(private_token(tmp)), "--tls-key", str(private_token(tmp))),
        ],
        "--tls-cert {tmp}/token and --tls-key {tmp}/token do not make a usable TLS key pair",
    ),
    "an address this machine does not have": (
        lambda tmp: ["shepherd", "--host", "192.0.2.1", "--token-file", str(private_token(tmp))],
        "cannot listen on 192.0.2.1:7433: Cannot assign requested address",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_shepherd_start_checks(case: str, tmp_path: Path, no_jax: dict[str, str]) -> None:
    """Each is one line and exit 2 before any heavy work, and leaves no run directory."""
    arguments, message = CASES[case]
    out = tmp_path / "run"
    result = run_pcp(*arguments(tmp_path), "--out", str(out), env=no_jax)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: " + message.format(tmp=tmp_path)), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()


def test_port_in_use(tmp_path: Path, no_jax: dict[str, str]) -> None:
    listener, port = busy_port()
    out = tmp_path / "run"
    with listener:
        result = run_pcp("shepherd", "--port", str(port), "--out", str(out), env=no_jax)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(is another shepherd running there? pick another --port)\n"
    )
    assert not out.exists()


def test_run_directory_that_cannot_be_created(tmp_path: Path, no_jax: dict[str, str]) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "run"
    result = run_pcp("shepherd", "--out", str(out), env=no_jax)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: cannot write the run directory {out}: Not a directory\n"


def test_worker_token_file_open_to_others(tmp_path: Path) -> None:
    """Refused by the worker command itself, before its supervisor starts it."""
    token = private_token(tmp_path, 0o640)
    result = run_pcp("worker", "--connect", "127.0.0.1:9", "--token-file", str(token))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: token file {token} has mode 0640")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--devices", "all"], "--devices: a cpu worker drives one device; start one worker"),
        (["--device", "0", "--devices", "all"], "--device and --devices name the same thing"),
    ],
)
def test_a_worker_on_several_devices_is_the_xla_backend_alone(args: list[str], says: str) -> None:
    result = run_pcp("worker", "--connect", "127.0.0.1:9", "--restarts", "0", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {says}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--algorithm", "diloco", "--devices-per-worker", "2"],
            "--devices-per-worker 2: a cpu worker drives one device",
        ),
        (["--n-embd", "1000000000"], "n_embd must be at most 1,048,576, got 1e+09"),
        (["--batch-size", "1000000000"], "batch_size must be at most"),
        (["--eval-batches", "1000000000000"], "eval_batches must be at most"),
        (["--algorithm", "diloco", "--workers", "100000"], "workers must be at most"),
        (["--algorithm", "diloco", "--worker-timeout", "1e308"], "worker_timeout must be at"),
        (["--algorithm", "diloco", "--min-workers", "5", "--workers", "2"], "min_workers (5)"),
        (["--n-embd", "100000"], "more than this machine's"),
        (["--eval-batches", "90000", "--batch-size", "90000"], "validation batches"),
        (["--algorithm", "diloco", "--workers", "1000"], "1000 training processes"),
    ],
)
def test_settings_that_would_crash_or_run_away_are_one_line_errors(
    args: list[str], says: str, tmp_path: Path
) -> None:
    result = run_pcp("train", *args, "--out", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_toml_step_count_with_no_end_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("steps = 1e30\n")
    result = run_pcp("train", "--config", str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "steps must be at most" in result.stderr, result.stderr
