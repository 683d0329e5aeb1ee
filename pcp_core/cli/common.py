"""What every `pcp` command shares: one-line errors, logging set-up, and the options
generated from the run configuration. The only place that configures logging.

Kept light: jax and iree are imported only by the commands that need them, so
`pcp --help` and `pcp plugins` return at once.
"""

import dataclasses
import inspect
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Optional

import structlog
import typer

from pcp_core import config as run_config
from pcp_core import config_file, exit_codes, plugins
from pcp_core.registry import DuplicateNameError, UnknownNameError

log = structlog.get_logger(__name__)


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by input a user can fix: shown as one line, not a traceback."""
    # imported here, not at the top: keeps `pcp --help` fast
    from pcp_core.backends import CompileError, DeviceError
    from pcp_core.data.errors import DataError
    from pcp_core.program.checkpoint import CheckpointError, CheckpointWriteError
    from pcp_core.shepherd.roster import NotEnoughWorkers
    from pcp_core.shepherd.session import RoundFailed

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


def option(name: str, annotation: Any, option: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=option
    )


RESUME_OPTION = option(
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


DASHBOARD_OPTION = option(
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


OVERWRITE_OPTION = option(
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


def _flag(name: str, kind: Any, help_text: str) -> inspect.Parameter:
    """An option `--NAME` of type `kind` whose value is None unless given, so that only
    flags given override the TOML file (the help says the real default)."""
    base = next(t for t in getattr(kind, "__args__", (kind,)) if t is not type(None))
    flag = "--" + name.replace("_", "-")
    return option(
        name,
        Optional[base],  # noqa: UP045
        typer.Option(None, flag, help=help_text, show_default=False),
    )


def _default(value: Any) -> str:
    # the bracket escaped from Rich's markup
    return "" if value is None else f" \\[default: {value}]"


def plugin_flags(declared: dict[str, type]) -> dict[str, inspect.Parameter]:
    """One flag per setting name that the plugins in `declared` declare: a name two
    plugins share (`--beta1` of two optimizers) is one flag that sets both. A name the
    core's settings already have is left out, with a warning."""
    owners: dict[str, list[tuple[str, dataclasses.Field[Any]]]] = {}
    for plugin, kind in declared.items():
        for field in dataclasses.fields(kind):
            owners.setdefault(field.name, []).append((plugin, field))
    flags = {}
    for name, fields in owners.items():
        if name in run_config.FIELDS:
            log.warning("a plugin's setting has a core setting's name; it has no flag",
                        setting=name, plugins=[plugin for plugin, _ in fields])  # fmt: skip
            continue
        help_text = " | ".join(
            f"{plugin}: {field.metadata['help']}{_default(field.default)}"
            for plugin, field in fields
        )
        flags[name] = _flag(name, fields[0][1].type, help_text)
    return flags


def with_run_config(
    command: Callable[..., None],
    defaults: dict[str, Any] | None = None,
    extra: list[inspect.Parameter] | None = None,
    declared: dict[str, type] | None = None,
) -> Callable[..., None]:
    """Give `command` one option per RunConfig field, one per setting of the installed
    plugins (`declared`, by plugin name), and `--config FILE.toml`.

    `defaults` replace the dataclass defaults for this command (the TOML file and flags
    still win over them); `extra` options are passed to `command` as keyword arguments.
    With RESUME_OPTION among them, `--resume RUN_DIR` reads RUN_DIR/config.toml as the
    config file and writes into RUN_DIR.
    """
    defaults = defaults or {}
    extra = extra or []
    declared = declared or {}
    config_option = typer.Option(None, "--config", help="TOML file of settings; flags win.")
    parameters = [*extra, option("config_file", Optional[Path], config_option)]  # noqa: UP045
    for name, field in run_config.FIELDS.items():
        shown = defaults.get(name, field.default)
        parameters.append(_flag(name, field.type, field.metadata["help"] + _default(shown)))
    for_plugins = plugin_flags(declared)
    parameters += for_plugins.values()

    def wrapper(**kwargs: Any) -> None:
        toml_path = kwargs.pop("config_file")
        extra_values = {p.name: kwargs.pop(p.name) for p in extra}
        resume = extra_values.get("resume")
        if resume is not None and extra_values.get("overwrite"):
            fail("--resume continues the run in RUN_DIR and --overwrite replaces it; pick one")
        if resume is not None:
            if toml_path is not None or kwargs.get("out") is not None:
                fail(
                    "--resume RUN_DIR uses RUN_DIR/config.toml and writes into RUN_DIR; "
                    "leave out --config and --out"
                )
            if not (resume / "config.toml").is_file():
                fail(f"--resume: {resume} is not a run directory (no config.toml in it)")
            toml_path, kwargs["out"] = resume / "config.toml", resume
        try:
            resolved = config_file.resolve(toml_path, kwargs, defaults, declared)
        except run_config.ConfigError as error:
            fail(str(error))
        command(resolved, **extra_values)

    wrapper.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    wrapper.__name__ = command.__name__
    wrapper.__doc__ = command.__doc__
    return wrapper


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


def interrupted(error: BaseException) -> bool:
    """Whether `error` is Ctrl-C, or came of it: a KeyboardInterrupt that lands while
    the main thread re-takes a `threading.Condition`'s lock (waiting on a future) leaves
    the lock untaken, and leaving the `with` block then raises RuntimeError("cannot
    release un-acquired lock") in its place (CPython 3.11), the interrupt as its context."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__context__
    return False


def run_or_explain(body: Callable[[], None]) -> None:
    """Run a command body, turning user errors into one line and Ctrl-C into exit 130."""
    try:
        body()
    except BaseException as error:
        if interrupted(error):
            typer.secho("interrupted", fg=typer.colors.YELLOW, err=True)
            raise typer.Exit(exit_codes.INTERRUPTED) from None
        if not isinstance(error, user_errors()):
            raise
        # imported here, not at the top: keeps `pcp --help` fast
        from pcp_core.program.checkpoint import CheckpointWriteError  # loaded by _user_errors

        code = exit_codes.CHECKPOINT if isinstance(error, CheckpointWriteError) else None
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        fail(message, code or exit_codes.CONFIGURATION)
