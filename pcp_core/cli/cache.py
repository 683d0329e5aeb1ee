"""`pcp cache`: what PCP's compile cache holds, and emptying it.

Light to import (typer; `pcp_core.compile_cache` needs only structlog besides the
standard library), so `pcp --help` stays fast.
"""

import collections
import time

import typer

from pcp_core import compile_cache
from pcp_core.cli.common import fail

cache_app = typer.Typer(
    help="Show or empty the compile cache: IREE modules, exported programs and `xla` "
    "workers' compiled steps, kept between runs ($PCP_CACHE_DIR).",
    no_args_is_help=True,
)


def _size(size: float) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"


@cache_app.command("show")
def show() -> None:
    """Where the compile cache is, whether PCP uses it, its size limit and what it holds."""
    path = compile_cache.cache_dir()
    typer.echo(f"compile cache: {path}")
    limit = compile_cache.max_bytes()
    typer.echo(f"size limit: {_size(limit)} ($PCP_CACHE_MAX_GB; least recently used go first)")
    if not path.exists():
        typer.echo("empty: not created yet (the first compile creates it)")
        return
    reason = compile_cache.unsafe_cache_dir_reason(path.resolve())
    if reason:
        typer.echo(f"not used: {reason}; PCP compiles without it (chmod 700 a folder of your own)")
    found = compile_cache.entries(path.resolve())
    if not found:
        typer.echo("empty")
        return
    by_kind: dict[str, list[compile_cache.Entry]] = collections.defaultdict(list)
    for entry in found:
        by_kind[entry.kind].append(entry)
    width = max(len(kind) for kind in by_kind)
    for kind, kept in sorted(by_kind.items()):
        last = time.strftime("%Y-%m-%d %H:%M", time.localtime(kept[-1].last_used))
        typer.echo(
            f"  {kind:<{width}}  {len(kept):5d}  {_size(sum(e.size for e in kept)):>10}"
            f"  last used {last}"
        )
    total = sum(entry.size for entry in found)
    typer.echo(f"  {'total':<{width}}  {len(found):5d}  {_size(total):>10}")


@cache_app.command("clear")
def clear() -> None:
    """Remove every entry: the next run compiles its programs again."""
    path = compile_cache.cache_dir()
    if not path.exists():
        typer.echo(f"nothing to clear: {path} does not exist")
        return
    directory = path.resolve()
    reason = compile_cache.unsafe_cache_dir_reason(directory)
    if reason:
        fail(
            f"not clearing {path}: {reason}, so others could have put files there and PCP "
            "leaves them alone: chmod 700 it if it is yours and clear again, or delete it yourself"
        )
    removed, failures = compile_cache.remove_until(directory, limit=0)
    freed = _size(sum(entry.size for entry in removed))
    typer.echo(f"removed {_entries(len(removed))} ({freed}) from {path}")
    if failures:
        fail(f"could not remove {_entries(len(failures))}, the first: {failures[0]}")


def _entries(count: int) -> str:
    return f"{count} entry" if count == 1 else f"{count} entries"
