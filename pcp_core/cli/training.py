"""`pcp train`, `pcp shepherd` and `pcp compile`: the commands that take a run configuration."""

from pathlib import Path

import typer

from pcp_core import config as run_config
from pcp_core import plugins
from pcp_core.cli.common import (
    DASHBOARD_OPTION,
    OVERWRITE_OPTION,
    RESUME_OPTION,
    fail,
    option,
    report,
    run_or_explain,
    with_run_config,
)


def train(
    config: run_config.RunConfig, resume: Path | None, overwrite: bool, dashboard: bool | None
) -> None:
    """Train a model: by default the small built-in GPT on the built-in corpus, on the CPU.

    Writes metrics.jsonl, summary.json, config.toml and checkpoint.safetensors to the run
    directory (--out).
    """
    from pcp_core import run  # here, not at the top: keeps `pcp --help` fast

    run_or_explain(
        lambda: report(
            run.train(
                config,
                local_workers=True,
                resume=resume is not None,
                overwrite=overwrite,
                dashboard=dashboard,
            )
        )
    )


def shepherd(
    config: run_config.RunConfig, resume: Path | None, overwrite: bool, dashboard: bool | None
) -> None:
    """Coordinate a distributed run: wait for --workers to join, then drive the rounds.

    Start workers elsewhere with `pcp worker --connect HOST:PORT --backend NAME`. Listening
    beyond loopback needs a shared secret (--token-file or PCP_TOKEN).
    """

    from pcp_core import run  # here, not at the top: keeps `pcp --help` fast

    def body() -> None:
        if plugins.host().algorithm(config.algorithm).worker_round is None:
            fail(f"algorithm {config.algorithm!r} is not distributed; use --algorithm diloco")
        report(
            run.train(
                config,
                local_workers=False,
                resume=resume is not None,
                overwrite=overwrite,
                dashboard=dashboard,
            )
        )

    run_or_explain(body)


def compile_vmfb(config: run_config.RunConfig, output: Path) -> None:
    """Build the training program for a backend, without needing its hardware.

    Useful to check a target from a build machine: `pcp compile --backend rocm
    --target gfx942 -o train.vmfb`. The program is the one `pcp train` would run with
    the same settings (model size, batch, steps per call, optimizer, data). IREE backends
    write a VMFB; others their own artifact (pcp-xla: a serialized jax.export).
    """

    def body() -> None:
        # imported here, not at the top: keeps `pcp --help` fast
        from pcp_core.program.training import prepare, resolve_backend

        host = plugins.host()
        backend, arch = resolve_backend(config, host)
        setup = prepare(config, host)
        artifact = backend.runtime.build(setup.program, backend, arch)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_bytes(artifact.data)
        typer.echo(
            f"{output}: {len(artifact.data):,} bytes ({artifact.kind}) for {backend.name} "
            f"({arch}), sha256 {artifact.sha256[:16]}…"
        )

    run_or_explain(body)


OUTPUT_OPTION = option(
    "output", Path, typer.Option(..., "--output", "-o", help="Where to write the program.")
)


def register(app: typer.Typer, declared: dict[str, type]) -> None:
    """Add train, shepherd and compile to `app`, with a flag for every setting of the
    installed plugins that `declared` lists (`pcp_core.config_file.declared_settings`)."""
    run_options = [RESUME_OPTION, OVERWRITE_OPTION, DASHBOARD_OPTION]
    app.command("train")(with_run_config(train, extra=run_options, declared=declared))
    app.command("shepherd")(
        with_run_config(
            shepherd, defaults={"algorithm": "diloco"}, extra=run_options, declared=declared
        )
    )
    app.command("compile")(with_run_config(compile_vmfb, extra=[OUTPUT_OPTION], declared=declared))
