"""The `pcp` command: its commands, gathered from one module per family."""

import os
import sys
from typing import Any

import typer

from pcp_core import plugins
from pcp_core.cli import info, launch, training, worker
from pcp_core.cli.cache import cache_app
from pcp_core.cli.common import LOG_FORMATS, configure_logging, fail
from pcp_core.cli.data import data_app
from pcp_core.cli.plot import plot
from pcp_core.cli.token import token_app
from pcp_core.config_file import declared_settings

app = typer.Typer(
    name="pcp",
    help="PCP, the Planetary Compute Protocol: train one model across loosely connected "
    "machines with whatever accelerators they have.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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


app.callback()(setup)
worker.register(app)
info.register(app)
launch.register(app)
app.add_typer(data_app, name="data")
app.add_typer(cache_app, name="cache")
app.add_typer(token_app, name="token")
app.command("plot")(plot)


# `pcp`'s own options, with the number of values each takes: accepted after the command
# too (`pcp train --log-format json`), where typer alone would refuse them
GLOBAL_OPTIONS = {"--log-format": 1, "--verbose": 0}


def hoisted(args: list[str]) -> list[str]:
    """`args` with `pcp`'s own options moved before the command, wherever they were."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        argument = args[i]
        if argument == "--":
            rest += args[i:]
            break
        name = argument.split("=", 1)[0]
        if name in GLOBAL_OPTIONS:
            taken = 1 if "=" in argument else 1 + GLOBAL_OPTIONS[name]
            front += args[i : i + taken]
            i += taken
            continue
        rest.append(argument)
        i += 1
    return front + rest


def with_plugins(host: Any) -> typer.Typer:
    """The app with the commands that depend on the installed plugins: `pcp train` and
    `pcp shepherd` with every plugin's settings, and the plugins' own commands."""
    training.register(app, declared_settings(host))
    host.add_commands(app)
    return app


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
    with_plugins(host)(args=hoisted(sys.argv[1:]), prog_name="pcp")
