"""The `pcp` command line. The only place that configures logging.

Kept light: jax and iree are imported only by the commands that need them, so
`pcp --help` and `pcp plugins` return at once.
"""

import contextlib
import dataclasses
import inspect
import json
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Optional

import structlog
import typer

from pcp_core import config as run_config
from pcp_core import exit_codes, plugins
from pcp_core.cli_data import data_app
from pcp_core.cli_plot import plot
from pcp_core.registry import DuplicateNameError, UnknownNameError

log = structlog.get_logger(__name__)

app = typer.Typer(
    name="pcp",
    help="PCP, the Planetary Compute Protocol: train one model across loosely connected "
    "machines with whatever accelerators they have.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by input a user can fix: shown as one line, not a traceback."""
    from pcp_core.checkpoint import CheckpointError, CheckpointWriteError
    from pcp_core.compiler import CompileError
    from pcp_core.data import DataError
    from pcp_core.executor import DeviceError
    from pcp_core.shepherd import NotEnoughWorkers, RoundFailed

    return (
        run_config.ConfigError,
        DataError,
        UnknownNameError,
        DuplicateNameError,
        CompileError,
        DeviceError,
        plugins.PluginLoadError,
        NotEnoughWorkers,
        RoundFailed,
        CheckpointError,
        CheckpointWriteError,  # exit_codes.CHECKPOINT
        FloatingPointError,  # a diverging run
        ValueError,
        FileNotFoundError,
    )


def fail(message: str, code: int = exit_codes.CONFIGURATION) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


LOG_FORMATS = ("auto", "console", "json")


def configure_logging(verbose: bool, log_format: str = "auto") -> None:
    """Pretty lines on a terminal, JSON lines otherwise (`auto`), or as asked.

    `$PCP_LOG_FORMAT` gives the default, so the processes a run starts (its local
    workers) log the same way.
    """
    level = logging.DEBUG if verbose else logging.INFO
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # Looked up per message, so logs go wherever stderr points now (the dashboard
        # redirects it while it is shown).
        logger_factory=lambda *args: structlog.PrintLogger(sys.stderr),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso" if log_format == "json" else "%H:%M:%S"),
            renderer,
        ],
    )


def _option(name: str, annotation: Any, option: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=option
    )


RESUME_OPTION = _option(
    "resume",
    Optional[Path],  # noqa: UP045
    typer.Option(
        None,
        "--resume",
        help="Continue the run in RUN_DIR from its last intact checkpoint, with its "
        "config.toml (flags given here win, e.g. a larger --steps).",
        metavar="RUN_DIR",
    ),
)

DASHBOARD_OPTION = _option(
    "dashboard",
    Optional[bool],  # noqa: UP045
    typer.Option(
        None,
        "--dashboard/--no-dashboard",
        help="Show the live dashboard (workers, losses, throughput) instead of log lines. "
        "Default: on when stderr is a terminal.",
        show_default=False,
    ),
)

OVERWRITE_OPTION = _option(
    "overwrite",
    bool,
    typer.Option(
        False,
        "--overwrite",
        help="Replace the run already in --out: its config, metrics, summary, checkpoints "
        "and local workers' logs and state are deleted first (without this, a directory "
        "that holds a run is refused).",
    ),
)


def with_run_config(
    command: Callable[..., None],
    defaults: dict[str, Any] | None = None,
    extra: list[inspect.Parameter] | None = None,
) -> Callable[..., None]:
    """Give `command` one option per RunConfig field plus `--config FILE.toml`.

    `defaults` replace the dataclass defaults for this command (the TOML file and flags
    still win over them); `extra` options are passed to `command` as keyword arguments.
    With RESUME_OPTION among them, `--resume RUN_DIR` reads RUN_DIR/config.toml as the
    config file and writes into RUN_DIR.
    """
    defaults = defaults or {}
    extra = extra or []
    parameters = [
        *extra,
        _option(
            "config_file",
            Optional[Path],  # noqa: UP045
            typer.Option(None, "--config", help="TOML file of settings; flags win."),
        ),
    ]
    for field in dataclasses.fields(run_config.RunConfig):
        base = next(
            t for t in getattr(field.type, "__args__", (field.type,)) if t is not type(None)
        )
        shown = defaults.get(field.name, field.default)
        flag = "--" + field.name.replace("_", "-")
        # the value is None so that only flags given override the TOML file; the help
        # shows the real default, its bracket escaped from Rich's markup
        default = "" if shown is None else f" \\[default: {shown}]"
        help_text = field.metadata["help"] + default
        parameters.append(
            _option(
                field.name,
                Optional[base],  # noqa: UP045
                typer.Option(None, flag, help=help_text, show_default=False),
            )
        )

    def wrapper(**kwargs: Any) -> None:
        config_file = kwargs.pop("config_file")
        extra_values = {p.name: kwargs.pop(p.name) for p in extra}
        resume = extra_values.get("resume")
        if resume is not None and extra_values.get("overwrite"):
            fail("--resume continues the run in RUN_DIR and --overwrite replaces it; pick one")
        if resume is not None:
            if config_file is not None or kwargs.get("out") is not None:
                fail(
                    "--resume RUN_DIR uses RUN_DIR/config.toml and writes into RUN_DIR; "
                    "leave out --config and --out"
                )
            if not (resume / "config.toml").is_file():
                fail(f"--resume: {resume} is not a run directory (no config.toml in it)")
            config_file, kwargs["out"] = resume / "config.toml", resume
        try:
            resolved = run_config.resolve(config_file, kwargs, defaults)
        except run_config.ConfigError as error:
            fail(str(error))
        command(resolved, **extra_values)

    wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    wrapper.__name__ = command.__name__
    wrapper.__doc__ = command.__doc__
    return wrapper


def run_algorithm(
    config: run_config.RunConfig,
    local_workers: bool,
    resume: bool = False,
    overwrite: bool = False,
    dashboard: bool | None = None,
) -> dict[str, Any]:
    """Run the configured algorithm into a run directory; shared by train and shepherd.

    With `local_workers`, a distributed algorithm starts its own workers on this machine;
    with `resume`, it continues the run in `config.out` from its checkpoint. A directory
    that already holds a run is refused unless `resume` or `overwrite` (which deletes
    the earlier run's files once every check has passed). `dashboard` (default: when
    stderr is a terminal) shows the live dashboard instead of progress log lines.
    """
    from pcp_core.algorithms import RunContext
    from pcp_core.metrics import (
        earlier_run,
        new_run_dir,
        open_metrics,
        remove_earlier_run,
        write_json,
    )
    from pcp_core.run_status import RunStatus
    from pcp_core.status_server import serving

    host = plugins.host()
    algorithm = host.algorithm(config.algorithm)
    host.model(config.model)  # unknown names fail here, before --overwrite deletes anything
    host.dataset(config.dataset)
    host.optimizer(config.optimizer)
    if resume and not algorithm.resumable:
        raise run_config.ConfigError(f"algorithm {config.algorithm!r} cannot resume a run")
    run_dir = Path(config.out) if config.out else new_run_dir()
    if not (resume or overwrite) and (found := earlier_run(run_dir)):
        raise run_config.ConfigError(
            f"{run_dir} already holds a run ({', '.join(found)}): pass --resume {run_dir} "
            "to continue it or --overwrite to replace it, or choose another --out"
        )
    for name in {config.backend, *config.local_worker_backends()}:
        host.backend(name).check_precision(config.precision)  # fail before any work
    if local_workers:  # no worker starts, to crash and be restarted, without a device
        for name in sorted(set(config.local_worker_backends())):
            backend = host.backend(name)
            backend.runner().require_device(backend, config.device)
    if dashboard is None:
        dashboard = sys.stderr.isatty()
    status = RunStatus(log_progress=not dashboard)
    status.describe(algorithm=config.algorithm, backend=config.backend, run_dir=str(run_dir))
    with contextlib.ExitStack() as stack:
        if algorithm.worker_round is not None:  # the secret, TLS files and port, bound now
            from pcp_core.distributed import open_endpoint

            endpoint = open_endpoint(config, host, local_workers)
            stack.callback(endpoint.close)
        else:
            endpoint = None
        stack.enter_context(serving(status, config.status_host, config.status_port))
        if overwrite:
            remove_earlier_run(run_dir)
        start_run_dir(run_dir, config)
        metrics = open_metrics(
            host.metric_sinks(), run_dir, run_config.to_dict(config), resume, (status.record,)
        )
        stack.callback(metrics.close)
        if dashboard:
            from pcp_core.dashboard import Dashboard

            stack.enter_context(Dashboard(status))
        ctx = RunContext(
            config=config,
            run_dir=run_dir,
            metrics=metrics,
            plugins=host,
            progress=status,
            status=status,
            local_workers=local_workers,
            resume=resume,
            endpoint=endpoint,
        )
        try:
            summary = algorithm.run(ctx)
        except KeyboardInterrupt:
            status.set_state("interrupted", quiet=True)  # the CLI says it
            raise
        except BaseException:
            status.set_state("failed", quiet=True)  # the CLI prints the error
            raise
        status.set_state("done")
    try:
        write_json(run_dir / "summary.json", summary)
        from pcp_core.plots import write_loss_png

        write_loss_png(run_dir)
    except OSError as error:
        log.error("summary not written", run_dir=str(run_dir), error=error.strerror or str(error))
    if summary.get("checkpoint_error"):
        from pcp_core.checkpoint import CheckpointWriteError

        raise CheckpointWriteError(
            f"the run trained to its end, but its last checkpoint was not written "
            f"({summary['checkpoint_error']}); the previous one is kept"
        )
    return summary | {"run_dir": str(run_dir)}


def start_run_dir(run_dir: Path, config: run_config.RunConfig) -> None:
    """Create the run directory (unless it exists) and write its config.toml into it;
    one that cannot be created or written is a ConfigError, and one created here is
    removed again."""
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(run_config.to_toml(config), encoding="utf-8")
    except OSError as error:
        if created and run_dir.is_dir():
            with contextlib.suppress(OSError):
                run_dir.rmdir()
        raise run_config.ConfigError(
            f"cannot write the run directory {run_dir}: {error.strerror or error}"
        ) from None


def report(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="run summary", show_header=False)
    for key in (
        "final_train_loss",
        "final_val_loss",
        "unigram_entropy",
        "tokens_per_s",
        "wall_time_s",
        "backend",
        "run_dir",
    ):
        value = summary.get(key)
        if value is not None:
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    Console().print(table)


def run_or_explain(body: Callable[[], None]) -> None:
    """Run a command body, turning user errors into one line and Ctrl-C into exit 130."""
    try:
        body()
    except KeyboardInterrupt:
        typer.secho("interrupted", fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(exit_codes.INTERRUPTED) from None
    except _user_errors() as error:
        from pcp_core.checkpoint import CheckpointWriteError  # loaded by _user_errors

        code = exit_codes.CHECKPOINT if isinstance(error, CheckpointWriteError) else None
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        fail(message, code or exit_codes.CONFIGURATION)


def train(
    config: run_config.RunConfig, resume: Path | None, overwrite: bool, dashboard: bool | None
) -> None:
    """Train a model: by default the small built-in GPT on the built-in corpus, on the CPU.

    Writes metrics.jsonl, summary.json, config.toml and checkpoint.safetensors to the run
    directory (--out).
    """
    run_or_explain(
        lambda: report(
            run_algorithm(
                config,
                local_workers=True,
                resume=resume is not None,
                overwrite=overwrite,
                dashboard=dashboard,
            )
        )
    )


app.command("train")(
    with_run_config(train, extra=[RESUME_OPTION, OVERWRITE_OPTION, DASHBOARD_OPTION])
)


def shepherd(
    config: run_config.RunConfig, resume: Path | None, overwrite: bool, dashboard: bool | None
) -> None:
    """Coordinate a distributed run: wait for --workers to join, then drive the rounds.

    Start workers elsewhere with `pcp worker --connect HOST:PORT --backend NAME`. Listening
    beyond loopback needs a shared secret (--token-file or PCP_TOKEN).
    """

    def body() -> None:
        if plugins.host().algorithm(config.algorithm).worker_round is None:
            fail(f"algorithm {config.algorithm!r} is not distributed; use --algorithm diloco")
        report(
            run_algorithm(
                config,
                local_workers=False,
                resume=resume is not None,
                overwrite=overwrite,
                dashboard=dashboard,
            )
        )

    run_or_explain(body)


app.command("shepherd")(
    with_run_config(
        shepherd,
        defaults={"algorithm": "diloco"},
        extra=[RESUME_OPTION, OVERWRITE_OPTION, DASHBOARD_OPTION],
    )
)


def compile_vmfb(config: run_config.RunConfig, output: Path) -> None:
    """Build the training program for a backend, without needing its hardware.

    Useful to check a target from a build machine: `pcp compile --backend rocm
    --target gfx942 -o train.vmfb`. The program is the one `pcp train` would run with
    the same settings (model size, batch, steps per call, optimizer, data). IREE backends
    write a VMFB; others their own artifact (pcp-xla: a serialized jax.export).
    """

    def body() -> None:
        from pcp_core.training import prepare, resolve_backend

        host = plugins.host()
        backend, arch = resolve_backend(config, host)
        setup = prepare(config, host)
        artifact = backend.runner().build(setup.program, backend, arch)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_bytes(artifact.data)
        typer.echo(
            f"{output}: {len(artifact.data):,} bytes ({artifact.kind}) for {backend.name} "
            f"({arch}), sha256 {artifact.sha256[:16]}…"
        )

    run_or_explain(body)


OUTPUT_OPTION = _option(
    "output", Path, typer.Option(..., "--output", "-o", help="Where to write the program.")
)
app.command("compile")(with_run_config(compile_vmfb, extra=[OUTPUT_OPTION]))


@app.command()
def sample(
    run_dir: Path = typer.Argument(..., help="A run directory (`pcp train --out`)."),
    prompt: str = typer.Option(
        "\n", "--prompt", help="Text to continue (default: a newline).", show_default=False
    ),
    tokens: int = typer.Option(200, "--tokens", help="Tokens to generate."),
    temperature: float = typer.Option(
        1.0, "--temperature", help="Below 1: likelier picks; above 1: more varied."
    ),
    top_k: Optional[int] = typer.Option(  # noqa: UP045
        None, "--top-k", help="Draw only from the K likeliest tokens (default: all)."
    ),
    seed: int = typer.Option(0, "--seed", help="Sampling seed: the same seed, the same text."),
) -> None:
    """Continue a prompt with a run's trained model (on the CPU); print prompt + continuation."""

    def body() -> None:
        from pcp_core.sampling import sample as continue_prompt

        text = continue_prompt(run_dir, prompt, tokens, temperature, top_k, seed, plugins.host())
        typer.echo(text)

    run_or_explain(body)


@app.command()
def devices(
    as_json: bool = typer.Option(False, "--json", help="Print the device table as JSON."),
) -> None:
    """For every installed backend: is its runtime driver present, which devices it sees,
    and the architecture PCP would compile for."""
    backends = plugins.host().registries["backend"].values()
    rows = [backend.runner().describe_devices(backend) for backend in backends]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="PCP devices")
    for column in ("backend", "driver", "available", "devices", "arch", "note"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r["backend"],
            r["driver"],
            "yes" if r["available"] else "no",
            "\n".join(r["devices"]),
            r["arch"],
            r["note"],
        )
    Console().print(table)


@app.command()
def worker(
    connect: str = typer.Option(..., "--connect", help="The shepherd's HOST:PORT."),
    backend: str = typer.Option("cpu", "--backend", help="Hardware backend to run on."),
    target: Optional[str] = typer.Option(  # noqa: UP045
        None, "--target", help="Device architecture (default: detect)."
    ),
    device: Optional[int] = typer.Option(  # noqa: UP045
        None, "--device", help="Device index (default: first)."
    ),
    token_file: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--token-file", help="File holding the shared secret (else $PCP_TOKEN)."
    ),
    transport: str = typer.Option("capnp-tcp", "--transport", help="Transport to the shepherd."),
    tls_ca: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--tls-ca", help="CA (PEM) to verify the shepherd's TLS certificate; enables TLS."
    ),
    timeout: float = typer.Option(
        30.0,
        "--timeout",
        help="Seconds the shepherd may stay silent (it sends heartbeats) before this worker "
        "gives up on the connection and, supervised, reconnects.",
    ),
    state_dir: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--state-dir",
        help="Where the inner optimizer state is saved after each round, so a restarted "
        "worker resumes it. Default: a folder per shepherd address and backend in the "
        "user state directory.",
    ),
    data: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--data",
        help="A prepared dataset (`pcp data prepare`) on this machine: the shards the "
        "shepherd assigns are read from it, checked against the shepherd's sha256, instead "
        "of fetched.",
    ),
    shard_cache: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--shard-cache",
        help="Where shards fetched from the shepherd are kept, by content hash, so a "
        "restarted worker fetches none twice. Default: the user cache directory.",
    ),
    restarts: int = typer.Option(
        5,
        "--restarts",
        help="Restart after a crash, with backoff, up to this many times in a row (a join, "
        "or a run of over a minute, resets the count); 0: never, and no reconnecting.",
    ),
    give_up_after: float = typer.Option(
        24 * 3600.0,
        "--give-up-after",
        help="Seconds to keep reconnecting, with backoff up to 30 s, while the shepherd is "
        "out of reach (restarting, or the network down), counted from the last join.",
    ),
) -> None:
    """Join a shepherd and train on this machine's device until told to stop."""
    from pcp_core import worker as worker_runtime
    from pcp_core.transport import TransportError, TransportOptions

    host, _, port = connect.rpartition(":")
    if not host or not port.isdigit():
        fail(f"--connect must be HOST:PORT, got {connect!r}")
    if not (math.isfinite(timeout) and 0 < timeout <= run_config.MAX_SECONDS):
        fail(f"--timeout must be from 0 to {run_config.MAX_SECONDS:g} seconds, got {timeout}")
    if not (math.isfinite(give_up_after) and give_up_after >= 0):
        fail(f"--give-up-after must be a number of seconds, got {give_up_after}")
    if restarts < 0:
        fail(f"--restarts must not be negative, got {restarts}")
    from pcp_core.auth import AuthError, load_secret

    try:  # before the supervisor starts: a restart cannot fix these
        load_secret(token_file)
    except AuthError as error:
        fail(str(error))
    if tls_ca is not None and not tls_ca.is_file():
        fail(f"--tls-ca {tls_ca}: no such file")
    if data is not None and not (data / "manifest.json").is_file():
        fail(
            f"--data {data}: not a dataset directory (no manifest.json); "
            "make one with `pcp data prepare INPUT... -o DIR`"
        )
    if restarts > 0:
        from pcp_core.malloc import retaining_env
        from pcp_core.supervisor import Supervisor

        command = [sys.executable, "-m", "pcp_core", *sys.argv[1:], "--restarts", "0"]
        supervisor = Supervisor(
            command, env=retaining_env(), max_restarts=restarts, give_up_after_s=give_up_after
        )
        raise typer.Exit(supervisor.serve())

    def body() -> None:
        from pcp_core.supervisor import die_with_parent, mark_joined
        from pcp_core.worker_state import StateDirBusy, default_state_dir

        die_with_parent()

        try:
            options = worker_runtime.WorkerOptions(
                host=host.strip("[]"),
                port=int(port),
                backend=backend,
                target=target,
                device=device,
                secret=load_secret(token_file),
                transport=transport,
                transport_options=TransportOptions(timeout_s=timeout, tls_ca=tls_ca),
                state_dir=state_dir or default_state_dir(host, port, backend, device),
                data=data,
                shard_cache=shard_cache,
                on_joined=mark_joined,
            )
            worker_runtime.run_worker(options, plugins.host())
        except (worker_runtime.JoinRefused, AuthError, StateDirBusy) as error:
            typer.secho(f"error: refused: {error}", fg=typer.colors.RED, err=True)
            raise typer.Exit(exit_codes.REFUSED) from None
        except (TransportError, ConnectionError, TimeoutError) as error:
            fail(f"lost the shepherd: {error}", code=exit_codes.UNREACHABLE)

    run_or_explain(body)


@app.command("status")
def status(
    address: str = typer.Argument(..., help="A shepherd's status endpoint, HOST:PORT."),
    as_json: bool = typer.Option(False, "--json", help="Print the raw /status JSON."),
    watch: bool = typer.Option(False, "--watch", help="Keep redrawing it until Ctrl-C."),
) -> None:
    """Show a running shepherd's dashboard, read from its `--status-port` endpoint."""
    import time
    import urllib.error
    import urllib.request

    url = f"http://{address}/status" if "://" not in address else f"{address}/status"

    def fetch() -> dict[str, Any]:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            fail(f"no status at {url}: {reason} (is the run started with --status-port?)")

    from rich.console import Console

    from pcp_core.dashboard import render

    if as_json:
        typer.echo(json.dumps(fetch(), indent=2))
        return
    console = Console()
    if not watch:
        console.print(render(fetch(), console.size.width))
        return
    from rich.live import Live

    with contextlib.suppress(KeyboardInterrupt), Live(console=console) as live:
        while True:
            live.update(render(fetch(), console.size.width))
            time.sleep(1.0)


@app.command("plugins")
def list_plugins(
    as_json: bool = typer.Option(False, "--json", help="Print the plugin table as JSON."),
) -> None:
    """List installed plugin distributions, what each registers, and load errors."""
    host = plugins.host()
    records = [dataclasses.asdict(r) for r in host.records.values()]
    if as_json:
        typer.echo(json.dumps(records, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="PCP plugins")
        for column in ("distribution", "version", "registers", "errors"):
            table.add_column(column)
        for r in records:
            registers = ", ".join(f"{kind} {name}" for kind, name in r["registered"])
            table.add_row(r["distribution"], r["version"], registers, "\n".join(r["errors"]))
        Console().print(table)
    if host.errors() and plugins.strict_mode():
        raise typer.Exit(1)


plugin_app = typer.Typer(
    help="Write a new plugin package (`pcp plugins` lists the installed ones).",
    no_args_is_help=True,
)
app.add_typer(plugin_app, name="plugin")
app.add_typer(data_app, name="data")
app.command("plot")(plot)


NEW_PLUGIN_HELP = (
    "Write pcp-NAME/, an installable plugin package of KIND: a working implementation "
    "to change into yours, tests that run the core's conformance suite for KIND, a README "
    'and the entry point. `pip install -e ".\\[test]"` and `pytest` in it pass as generated.'
)


@plugin_app.command("new", help=NEW_PLUGIN_HELP)
def plugin_new(
    name: str = typer.Argument(..., help="Registered name, e.g. my-sgd (package pcp-my-sgd)."),
    kind: str = typer.Option(
        ..., "--kind", help="backend, optimizer, transport, algorithm, model or dataset."
    ),
    directory: Path = typer.Option(Path("."), "--dir", help="Where to create pcp-NAME/."),
) -> None:
    """Write pcp-NAME/, an installable plugin package of KIND."""
    from pcp_core.scaffold import ScaffoldError, new_plugin

    try:
        root = new_plugin(name, kind, directory)
    except ScaffoldError as error:
        fail(str(error))
    typer.echo(f"wrote {root}: cd {root} && pip install -e '.[test]' && pytest")


@app.callback()
def setup(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
    log_format: str = typer.Option(
        os.environ.get("PCP_LOG_FORMAT", "auto"),
        "--log-format",
        help="Log lines as auto (pretty on a terminal, JSON lines otherwise), console or "
        "json; $PCP_LOG_FORMAT sets the default.",
        metavar="auto|console|json",
    ),
) -> None:
    if log_format not in LOG_FORMATS:
        fail(f"--log-format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    os.environ["PCP_LOG_FORMAT"] = log_format  # the processes this one starts log alike
    configure_logging(verbose, log_format)


def main() -> None:
    # JAX (the shepherd's export and validation) must not take 75% of a GPU that IREE
    # workers on the same machine need: allocate on demand.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    log_format = os.environ.get("PCP_LOG_FORMAT", "auto")  # before discovery: its warnings
    configure_logging(False, log_format if log_format in LOG_FORMATS else "auto")
    try:
        host = plugins.host()
    except plugins.PluginLoadError as error:
        typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
        sys.exit(1)
    host.add_commands(app)
    app()
