"""`pcp launch LAUNCHER`: start a whole run (shepherd and workers) on a cluster engine."""

import shlex
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from pcp_core import plugins
from pcp_core.cli.common import fail, run_or_explain
from pcp_core.shepherd_settings import DEFAULT_PORT


def launch(
    context: typer.Context,
    launcher_name: Optional[str] = typer.Argument(  # noqa: UP045
        None,
        metavar="LAUNCHER",
        help="How to start the run: slurm, mpi, kubernetes, or a plugin's.",
    ),
    workers: Optional[int] = typer.Option(None, "--workers", help="Workers to start."),  # noqa: UP045
    run_dir: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--run-dir",
        help="Where the script, the secret, the logs and the run go; every node must see it "
        "at this path (a shared file system). Default: runs/LAUNCHER-<timestamp>.",
    ),
    port: int = typer.Option(
        DEFAULT_PORT, "--port", help="The shepherd's TCP port (as `pcp shepherd`'s)."
    ),
    worker_args: str = typer.Option(
        "",
        "--worker-args",
        help="More `pcp worker` options, one shell-quoted string, e.g. '--backend xla "
        "--devices all'.",
    ),
    options: list[str] = typer.Option(
        [], "--option", "-o", help="The launcher's own setting, KEY=VALUE; repeat for more."
    ),
    python: str = typer.Option(
        sys.executable, "--python", help="The Python with PCP installed, on every node."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Write the script and the secret; submit nothing."
    ),
    show_list: bool = typer.Option(
        False, "--list", help="List the installed launchers and their options, and exit."
    ),
) -> None:
    """Start a run on a cluster engine: write its script into the run directory with a
    fresh secret (mode 0600, never on a command line), then submit it.

    Arguments after `--` are the run's settings, as `pcp shepherd` takes them:
    `pcp launch slurm --workers 4 -o partition=gpu -- --steps 5000 --inner-steps 100`.
    `pcp launch --list` shows the installed launchers and their options."""
    from pcp_core.launch.prepare import build_request, submit, write

    if show_list:
        list_launchers()
        return
    if launcher_name is None or workers is None:
        fail("give a LAUNCHER and --workers (`pcp launch --list` shows the launchers)")

    def body() -> None:
        launcher = plugins.host().launcher(launcher_name)
        settings = dict(parse_option(item) for item in options)
        try:
            extra_worker_args = shlex.split(worker_args)
        except ValueError as error:
            fail(f"--worker-args: {error}")
        request = build_request(
            launcher,
            run_dir or Path("runs") / f"{launcher.name}-{time.strftime('%Y%m%d-%H%M%S')}",
            workers,
            port,
            python,
            context.args,
            extra_worker_args,
            settings,
        )
        plan = write(launcher, request, dry_run)
        written = ", ".join(sorted([*plan.files, "token", "launch.json"]))
        typer.echo(f"{request.run_dir}: wrote {written}")
        if plan.submit is None:
            return
        command = " ".join(plan.submit)
        if dry_run:
            typer.echo(f"dry run: submit with `cd {request.run_dir} && {command}`")
            return
        typer.echo(f"running `{command}` in {request.run_dir}")
        status = submit(plan, request)
        if status != 0:
            fail(f"{plan.submit[0]} exited with status {status}")
        typer.echo(plan.next_steps)

    run_or_explain(body)


def parse_option(item: str) -> tuple[str, str]:
    key, equals, value = item.partition("=")
    if not equals or not key:
        fail(f"--option must be KEY=VALUE, got {item!r}")
    return key.strip(), value


def list_launchers() -> None:
    """Print each installed launcher, its tool and its options."""
    for launcher in plugins.host().registries["launcher"].values():
        typer.echo(f"{launcher.name}: {launcher.description} (needs {launcher.tool or '-'})")
        for key, text in launcher.options.items():
            typer.echo(f"    -o {key}=...  {text}")


def register(app: typer.Typer) -> None:
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command("launch", context_settings=settings)(launch)
