"""What `pcp launch` does for every launcher: check the request, make the run
directory, write the secret and the plan's files owner-only, submit."""

import json
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from pcp_core.launchers import Launcher, LaunchError, LaunchPlan, LaunchRequest
from pcp_core.watch.run_directory import earlier_run
from pcp_core.wire.auth import write_private, write_secret

log = structlog.get_logger(__name__)

RECORD = "launch.json"  # what was launched, how, and how to resubmit


def build_request(
    launcher: Launcher,
    run_dir: Path,
    workers: int,
    port: int,
    python: str,
    shepherd_args: Sequence[str],
    worker_args: Sequence[str],
    options: Mapping[str, str],
) -> LaunchRequest:
    """The request, checked: LaunchError for what no launcher could use."""
    if workers < 1:
        raise LaunchError(f"--workers must be at least 1, got {workers}")
    if not 0 < port < 65536:
        raise LaunchError(f"--port must be from 1 to 65535, got {port}")
    unknown = sorted(set(options) - set(launcher.options))
    if unknown:
        known = ", ".join(sorted(launcher.options)) or "none"
        raise LaunchError(
            f"launcher {launcher.name!r} takes no option {', '.join(unknown)} (it takes: {known})"
        )
    for word in (*shepherd_args, *worker_args):
        flag = word.split("=", 1)[0]
        if flag in ("--token-file", "--out", "--resume", "--workers", "--connect", "--host"):
            raise LaunchError(f"{flag} is set by pcp launch; leave it out")
        if flag == "--port":
            raise LaunchError("--port is pcp launch's own option: give it before --")
    run_dir = run_dir.expanduser().resolve()
    if found := earlier_run(run_dir / "shepherd"):
        raise LaunchError(
            f"{run_dir} already holds a launched run ({', '.join(found)}); resubmit it with "
            "the command in its launch.json, or pick another --run-dir"
        )
    return LaunchRequest(
        run_dir=run_dir,
        token_file=run_dir / "token",
        workers=workers,
        port=port,
        python=python,
        shepherd_args=tuple(shepherd_args),
        worker_args=tuple(worker_args),
        options=dict(options),
    )


def write(launcher: Launcher, request: LaunchRequest, dry_run: bool) -> LaunchPlan:
    """Plan the launch and write the secret and the plan's files into the run
    directory; LaunchError if the plan cannot be submitted from here (unless `dry_run`)."""
    plan = launcher.plan(request)
    tool = launcher.tool
    if not dry_run and plan.submit and tool and shutil.which(tool) is None:
        raise LaunchError(
            f"{tool} is not on PATH, so launcher {launcher.name!r} cannot submit from this "
            "machine; --dry-run writes the files without submitting"
        )
    try:
        request.run_dir.mkdir(parents=True, exist_ok=True)
        write_secret(request.token_file)
        for name, text in plan.files.items():
            mode = 0o700 if name == plan.executable else 0o600
            write_private(request.run_dir / name, as_lines(text), mode)
        launched = json.dumps(record(launcher, request, plan), indent=2)
        write_private(request.run_dir / RECORD, as_lines(launched))
    except OSError as error:
        raise LaunchError(f"cannot write {request.run_dir}: {error.strerror or error}") from None
    log.debug("launch written", launcher=launcher.name, run_dir=str(request.run_dir))
    return plan


def submit(plan: LaunchPlan, request: LaunchRequest) -> int:
    """Run the plan's submit command in the run directory; its exit status. A SIGTERM
    to `pcp launch` is passed on to it (a script or driver that runs the whole job in
    the foreground stops the job, rather than going on without its parent)."""
    assert plan.submit is not None
    child = subprocess.Popen(plan.submit, cwd=request.run_dir)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    try:
        return child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)


def as_lines(text: str) -> bytes:
    """`text` as UTF-8 that ends with a newline."""
    return (text if text.endswith("\n") else text + "\n").encode()


def record(launcher: Launcher, request: LaunchRequest, plan: LaunchPlan) -> dict:
    """launch.json: what was launched (no secret: only the token file's path)."""
    return {
        "launcher": launcher.name,
        "run_dir": str(request.run_dir),
        "workers": request.workers,
        "port": request.port,
        "options": dict(request.options),
        "shepherd": request.shepherd_command(),
        "files": sorted(plan.files),
        "submit": list(plan.submit) if plan.submit else None,
    }
