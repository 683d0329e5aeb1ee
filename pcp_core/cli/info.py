"""The commands that look at things: `pcp sample`, `export`, `devices`, `status`, `plugins`,
`plugin new`."""

import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Optional

import typer

from pcp_core import plugins
from pcp_core.cli.common import fail, run_or_explain


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
    backend: Optional[str] = typer.Option(  # noqa: UP045
        None,
        "--backend",
        help="Run on this installed backend through a key/value cache, one position a "
        "token (default: jax on the CPU, the whole context a token).",
    ),
    target: Optional[str] = typer.Option(  # noqa: UP045
        None, "--target", help="The backend's architecture (default: detected)."
    ),
) -> None:
    """Continue a prompt with a run's trained model; print prompt + continuation, and the
    tokens/s on stderr."""

    def body() -> None:
        # imported here, not at the top: keeps `pcp --help` fast
        import functools

        from pcp_core.program.sampling import sample as continue_prompt

        if target is not None and backend is None:
            fail("--target is the --backend's architecture: give --backend too")
        host = plugins.host()
        options: dict[str, Any] = {}
        if backend is not None:
            from pcp_core.iree.inference import decoder_for

            chosen = host.backend(backend)
            options = {"open_decoder": functools.partial(decoder_for, chosen, target)}
            options["runner"] = f"{chosen.name}, cached"
        result = continue_prompt(run_dir, prompt, tokens, host, temperature, top_k, seed, **options)
        typer.echo(result.text)
        generated = result.generated
        typer.echo(
            f"{len(generated.ids)} tokens in {generated.seconds:.2f} s: "
            f"{generated.tokens_per_s:.1f} tokens/s ({result.runner})",
            err=True,
        )

    run_or_explain(body)


def export(
    run_dir: Path = typer.Argument(..., help="A run directory (`pcp train --out`)."),
    format: str = typer.Option(..., "--format", help="onnx, stablehlo, iree or huggingface."),
    out: Path = typer.Option(
        ...,
        "-o",
        "--out",
        help="The file to write (iree: NAME.vmfb names NAME.prefill.vmfb and "
        "NAME.decode.vmfb); its tokenizer and metadata go beside it. huggingface: the "
        "folder to write.",
    ),
    backend: Optional[str] = typer.Option(  # noqa: UP045
        None, "--backend", help="--format iree: the installed IREE backend to compile for."
    ),
    target: Optional[str] = typer.Option(  # noqa: UP045
        None, "--target", help="--format iree: the backend's architecture (default: detected)."
    ),
) -> None:
    """Write a run's trained model as ONNX or StableHLO (logits from token ids), or as IREE
    modules with a key/value cache for a backend, with its tokenizer and a metadata file
    beside it; or as a Hugging Face GPT-2 folder that `transformers` loads."""

    def body() -> None:
        # imported here, not at the top: keeps `pcp --help` fast
        from pcp_core.program.export import export as write

        if target is not None and backend is None:
            fail("--target is the --backend's architecture: give --backend too")
        host = plugins.host()
        modules = None
        if backend is not None:
            from pcp_core.iree.inference import module_writer

            modules = module_writer(host.backend(backend), target)
        for path in write(run_dir, format, out, host, modules):
            typer.echo(f"wrote {path}")

    run_or_explain(body)


def devices(
    as_json: bool = typer.Option(False, "--json", help="Print the device table as JSON."),
) -> None:
    """For every installed backend: is its runtime driver present, which devices it sees,
    and the architecture PCP would compile for."""
    backends = plugins.host().registries["backend"].values()
    rows = [backend.runtime.describe_devices(backend) for backend in backends]
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="PCP devices")
    for column in ("backend", "runtime", "available", "devices", "arch", "note"):
        table.add_column(column, overflow="fold")  # at 80 columns, wrapped, never cut
    for r in rows:
        table.add_row(
            r.backend,
            r.runtime,
            "yes" if r.available else "no",
            "\n".join(r.devices),
            r.arch,
            r.note,
        )
    Console().print(table)


def status(
    address: str = typer.Argument(..., help="A shepherd's status endpoint, HOST:PORT."),
    as_json: bool = typer.Option(False, "--json", help="Print the raw /status JSON."),
    watch: bool = typer.Option(False, "--watch", help="Keep redrawing it until Ctrl-C."),
) -> None:
    """Show a running shepherd's dashboard, read from its `--status-port` endpoint."""
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

    # imported here, not at the top: keeps `pcp --help` fast
    from pcp_core.watch.dashboard import render

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
            table.add_column(column, overflow="fold")
        for r in records:
            registers = ", ".join(f"{kind} {name}" for kind, name in r["registered"])
            table.add_row(r["distribution"], r["version"], registers, "\n".join(r["errors"]))
        Console().print(table)
    if host.errors() and plugins.strict_mode():
        raise typer.Exit(1)


NEW_PLUGIN_HELP = (
    "Write pcp-NAME/, an installable plugin package of KIND: a working implementation "
    "to change into yours, tests that run the core's conformance suite for KIND, a README "
    'and the entry point. `pip install -e ".\\[test]"` and `pytest` in it pass as generated.'
)


def plugin_new(
    name: str = typer.Argument(..., help="Registered name, e.g. my-sgd (package pcp-my-sgd)."),
    kind: str = typer.Option(
        ...,
        "--kind",
        help="backend, optimizer, transport, algorithm, model, dataset, codec or launcher.",
    ),
    directory: Path = typer.Option(Path("."), "--dir", help="Where to create pcp-NAME/."),
) -> None:
    """Write pcp-NAME/, an installable plugin package of KIND."""
    # imported here, not at the top: keeps `pcp --help` fast
    from pcp_core.cli.scaffold import ScaffoldError, new_plugin

    try:
        root = new_plugin(name, kind, directory)
    except ScaffoldError as error:
        fail(str(error))
    typer.echo(f"wrote {root}: cd {root} && pip install -e '.[test]' && pytest")


def register(app: typer.Typer) -> None:
    """Add sample, export, devices, status, plugins and `plugin new` to `app`."""
    app.command("sample")(sample)
    app.command("export")(export)
    app.command("devices")(devices)
    app.command("status")(status)
    app.command("plugins")(list_plugins)
    plugin_app = typer.Typer(
        help="Write a new plugin package (`pcp plugins` lists the installed ones).",
        no_args_is_help=True,
    )
    plugin_app.command("new", help=NEW_PLUGIN_HELP)(plugin_new)
    app.add_typer(plugin_app, name="plugin")
