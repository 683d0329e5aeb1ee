"""`pcp plot`: draw a run's loss.png, for a finished run or one still going.

Light to import (typer only), so `pcp --help` stays fast; the drawing is in
`pcp_core.watch.plots`, which imports matplotlib when it draws.
"""

from pathlib import Path
from typing import Optional

import typer

from pcp_core.cli.common import fail, run_or_explain


def plot(
    run_dir: Path = typer.Argument(
        ..., help="A run directory (holds metrics.jsonl).", metavar="RUN_DIR"
    ),
    output: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--output",
        "-o",
        help="Where to write the PNG \\[default: RUN_DIR/loss.png].",
        metavar="PATH",
    ),
) -> None:
    """Write loss.png for RUN_DIR: train and validation loss against tokens, one line per
    worker; for DiLoCo also bytes and compute vs communication time per round. Works on a
    run still going. Prints the path written."""

    def body() -> None:
        # imported here, not at the top: keeps `pcp --help` fast
        from pcp_core.watch.plots import PlotError, plot_run

        try:
            path = plot_run(run_dir, output)
        except PlotError as error:
            fail(str(error))
        typer.echo(path)

    run_or_explain(body)
