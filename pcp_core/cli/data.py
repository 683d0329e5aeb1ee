"""`pcp data`: prepare token datasets that `pcp train --data DIR` reads.

Light to import (typer only), so `pcp --help` stays fast; the work is in
`pcp_core.data.prepare`.
"""

from pathlib import Path
from typing import Any, Optional

import typer

from pcp_core.cli.common import run_or_explain

data_app = typer.Typer(
    help="Prepare token datasets: tokenize text once into shards that training memory-maps.",
    no_args_is_help=True,
)

PREPARE_HELP = (
    "Tokenize INPUT... into token shards and a manifest.json in DIR (-o).\n\n"
    'INPUT is a text file, a JSON Lines file (*.jsonl: one object with a "text" field per '
    "line) or a directory, read recursively in sorted order for its *.txt, *.md and *.jsonl "
    "files. Memory stays bounded whatever the size: the text is streamed, shards are "
    "written as they fill, and the last --validation-fraction of every 2^20 tokens goes to "
    "validation. Train on the result with `pcp train --data DIR`."
)


@data_app.command("prepare", help=PREPARE_HELP)
def prepare(
    inputs: list[Path] = typer.Argument(
        ...,
        help="Text files, JSONL files or directories.",
        show_default=False,
        metavar="INPUT",
    ),
    output: Path = typer.Option(
        ..., "--output", "-o", help="The dataset directory to write.", metavar="DIR"
    ),
    tokenizer: str = typer.Option(
        "chars",
        "--tokenizer",
        help="chars (one token per character), bytes (UTF-8 bytes), bpe (a byte-level BPE "
        "trained on the input), a tokenizer.json file (Hugging Face format), or a Hugging "
        "Face model folder (its tokenizer.json, or GPT-2's vocab.json and merges.txt).",
    ),
    vocab_size: Optional[int] = typer.Option(  # noqa: UP045
        None, "--vocab-size", help="bpe: tokens in the trained vocabulary \\[default: 8192]."
    ),
    validation_fraction: float = typer.Option(
        0.1, "--validation-fraction", help="Share of the tokens kept for validation."
    ),
    shard_tokens: int = typer.Option(
        100_000_000, "--shard-tokens", help="Tokens per shard file (the last one holds fewer)."
    ),
    bpe_sample_bytes: int = typer.Option(
        100_000_000,
        "--bpe-sample-bytes",
        help="bpe: train the tokenizer on the first this many bytes of the input (its "
        "memory grows with the distinct words there: lower this if it is too much).",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace a dataset already in DIR (else it is refused)."
    ),
) -> None:
    def body() -> None:
        # imported here, not at the top: keeps `pcp --help` fast
        from pcp_core.data.prepare import PrepareOptions
        from pcp_core.data.prepare import prepare as run_prepare

        options = PrepareOptions(
            inputs=inputs,
            output=output,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            validation_fraction=validation_fraction,
            shard_tokens=shard_tokens,
            bpe_sample_bytes=bpe_sample_bytes,
            overwrite=overwrite,
        )
        with ByteBar() as bar:
            manifest = run_prepare(options, bar)
        totals = manifest.totals
        typer.echo(
            f"{output}: {totals['train_tokens']:,} train and {totals['validation_tokens']:,} "
            f"validation tokens in {len(manifest.shards)} shard(s), vocabulary "
            f"{manifest.vocab_size:,} ({manifest.dtype})"
        )

    run_or_explain(body)


class ByteBar:
    """A rich progress bar over the bytes of each pass, on stderr, shown only where
    there is a terminal to show it on."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        console = Console(stderr=True)
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not console.is_terminal,
            redirect_stderr=True,
        )
        self._task: Any = None

    def __enter__(self) -> "ByteBar":
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def start(self, description: str, total: int) -> None:
        if self._task is not None:  # the pass before is done (a bpe sample may end early)
            self._bar.update(self._task, completed=self._bar.tasks[self._task].total)
        self._task = self._bar.add_task(description, total=total)

    def advance(self, amount: int) -> None:
        if self._task is not None:
            self._bar.advance(self._task, amount)
