"""loss.png for a run directory, finished or still going.

One panel for a local run, 1200x500 px: train loss (`loss`) and validation loss
(`val_loss`, with markers) against tokens. A DiLoCo run (its records carry `round`)
gets 1200x800 px: the loss panel on top, with a line per worker (`worker_losses`)
beside the mean over workers, and below it two panels per round, bytes sent and
received, and compute against communication time.

Fixed sizes, so images of different runs compare side by side. matplotlib is imported
inside the functions only, so `pcp --help` stays instant; figures are drawn on the
Agg canvas without pyplot, so nothing global is touched.
"""

import contextlib
import json
import math
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

log = structlog.get_logger(__name__)

DPI = 100
WIDTH_PX = 1200
LOCAL_HEIGHT_PX = 500
DILOCO_HEIGHT_PX = 800
# the workers' colours: tab10 less its red, which marks validation
WORKER_COLORS: tuple[str, ...] = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")
WORKER_COLORS += ("tab:pink", "tab:gray", "tab:olive", "tab:cyan")


class PlotError(Exception):
    """A run directory that cannot be plotted, said in one line."""


def write_loss_png(run_dir: Path) -> Path | None:
    """loss.png in `run_dir` at the end of a run; on any error a warning and None, since
    a plot that fails must never fail the run that trained."""
    try:
        return plot_run(run_dir)
    except Exception as error:  # the run has finished: nothing here may undo that
        log.warning("loss.png not written", run_dir=str(run_dir), error=str(error))
        return None


def plot_run(run_dir: Path, output: Path | None = None) -> Path:
    """Write the run's loss plot to `output` (default `run_dir/loss.png`); return its path."""
    records = read_records(run_dir)
    output = output or run_dir / "loss.png"
    figure = loss_figure(records, run_title(run_dir))
    try:
        figure.savefig(output, format="png", dpi=DPI)
    except OSError as error:
        raise PlotError(f"cannot write {output}: {error.strerror or error}") from None
    return output


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of `run_dir/metrics.jsonl`. A last line without its newline is one
    still being written: it is skipped unless it already parses."""
    if not run_dir.is_dir():
        raise PlotError(f"no such run directory: {run_dir}")
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise PlotError(f"{run_dir} has no metrics.jsonl: is it a run directory?")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise PlotError(f"cannot read {path}: {error.strerror or error}") from None
    *lines, unfinished = text.split("\n")
    records = [_parse(line, path, number) for number, line in enumerate(lines, 1) if line.strip()]
    with contextlib.suppress(PlotError):
        records.append(_parse(unfinished, path, len(lines) + 1))
    if not records:
        raise PlotError(f"{path} has no records yet: the run has not finished a step")
    return records


def _parse(line: str, path: Path, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise PlotError(f"{path} line {number} is not JSON: {error.msg}") from None
    if not isinstance(record, dict):
        raise PlotError(f"{path} line {number} is not a JSON object")
    return record


def run_title(run_dir: Path) -> str:
    """The run directory's name, its algorithm and its backend(s), from config.toml."""
    name = run_dir.resolve().name
    try:
        config = tomllib.loads((run_dir / "config.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return name
    algorithm = config.get("algorithm", "?")
    shepherd = config.get("shepherd") or config  # at the top level before plugin API 5
    backends = shepherd.get("worker_backends") or config.get("backend", "?")
    if algorithm == "local":
        return f"{name}: {algorithm} on {backends}"
    return f"{name}: {algorithm}, {shepherd.get('workers', '?')} workers on {backends}"


def loss_figure(records: list[dict[str, Any]], title: str) -> "Figure":
    """The plot of `records` (metrics.jsonl's), on one panel or, for DiLoCo, three.

    The panels carry labels (`ax.get_label()`): "loss", and for DiLoCo "bytes" and
    "time"; each line its legend label.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    diloco = any("round" in r for r in records)
    height = DILOCO_HEIGHT_PX if diloco else LOCAL_HEIGHT_PX
    figure = Figure(figsize=(WIDTH_PX / DPI, height / DPI), dpi=DPI)
    FigureCanvasAgg(figure)
    figure.suptitle(title, fontsize="x-large")
    # Fixed margins, in pixels, for the fixed sizes: a layout engine measures every label
    # and draws the figure twice (a DiLoCo run's plot: 0.80 s of CPU with one, 0.45 s).
    figure.subplots_adjust(
        left=80 / WIDTH_PX,
        right=1 - 70 / WIDTH_PX,  # the utilisation axis's labels, right of the time panel
        top=1 - 55 / height,
        bottom=55 / height,
        hspace=0.35,
        wspace=0.22,
    )
    if diloco:
        axes = figure.subplot_mosaic([["loss", "loss"], ["bytes", "time"]], height_ratios=[3, 2])
        _loss_panel(axes["loss"], records)
        _bytes_panel(axes["bytes"], records)
        _time_panel(axes["time"], records)
    else:
        _loss_panel(figure.add_subplot(label="loss"), records)
    return figure


def _loss_panel(ax: "Axes", records: list[dict[str, Any]]) -> None:
    from matplotlib.ticker import EngFormatter

    workers = sorted({w for r in records for w in r.get("worker_losses", {})}, key=int)
    for index, worker in enumerate(workers):
        points = [
            (r, r["worker_losses"][worker]) for r in records if worker in r.get("worker_losses", {})
        ]
        x, y = _xy(points, "tokens")
        color = WORKER_COLORS[index % len(WORKER_COLORS)]
        ax.plot(x, y, color=color, linewidth=1, alpha=0.7, label=f"worker {worker}")
    train = "train (mean over workers)" if workers else "train"
    ax.plot(*_series(records, "tokens", "loss"), color="black", linewidth=2, label=train)
    x, y = _series(records, "tokens", "val_loss")
    if x:
        ax.plot(x, y, color="tab:red", marker="o", linewidth=1.5, label="validation")
    ax.set_xlabel("tokens, all workers" if workers else "tokens")
    ax.set_ylabel("loss (nats per token)")
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", ncols=1 + len(workers) // 8)


def _bytes_panel(ax: "Axes", records: list[dict[str, Any]]) -> None:
    keys = ("bytes_sent", "bytes_received", "pseudo_gradient_raw_bytes")
    largest = max(r.get(k) or 0 for r in records for k in keys)
    scale, unit = _byte_unit(largest)
    lines: tuple[tuple[str, ...], ...] = (
        ("bytes_sent", "sent", "-", "o"),
        ("bytes_received", "received", "--", "x"),
    )
    if any(r.get("pseudo_gradient_bytes") != r.get("pseudo_gradient_raw_bytes") for r in records):
        # encoded (--codec): what the received pseudo-gradients were as float32
        lines += (("pseudo_gradient_raw_bytes", "received as float32", ":", ""),)
    _per_round(ax, records, lines, scale)
    ax.set(title="bytes per round, shepherd to and from all workers", ylabel=f"{unit} per round")


def _time_panel(ax: "Axes", records: list[dict[str, Any]]) -> None:
    lines = (
        ("compute_s", "compute (slowest worker)", "-", "o"),
        ("communication_s", "communication", "-", "o"),
    )
    _per_round(ax, records, lines, 1)
    ax.set(title="time per round", ylabel="seconds")
    x, y = _series(records, "round", "compute_utilisation")
    if x:  # the share of the workers' time in inner steps, on an axis of its own
        share = ax.twinx()
        share.set_label("utilisation")
        share.plot(x, [100 * v for v in y], color="tab:green", linestyle=":", label="utilisation")
        share.set(ylim=(0, 105), ylabel="compute utilisation (%)")
        run = records[-1].get("run_compute_utilisation", y[-1])
        ax.set_title(f"time per round; compute utilisation {run:.0%} over the run")


def _per_round(
    ax: "Axes", records: list[dict[str, Any]], lines: tuple[tuple[str, ...], ...], scale: float
) -> None:
    """A line per (key, label, line style, marker) against the round, from 0 up to
    headroom above the highest point for the legend; sent and received bytes are
    nearly equal, so their markers differ and both stay visible."""
    from matplotlib.ticker import MaxNLocator

    top = 0.0
    for key, label, style, marker in lines:
        x, y = _series(records, "round", key)
        y = [v / scale for v in y]
        top = max([top, *(v for v in y if math.isfinite(v))])
        dots = marker if len(x) <= 60 else None  # while they can be told apart
        ax.plot(x, y, linestyle=style, marker=dots, label=label)
    ax.set_ylim(0, 1.3 * top or 1)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", ncols=len(lines))


def _series(records: list[dict[str, Any]], x: str, y: str) -> tuple[list[float], list[float]]:
    """`y` against `x` over the records that carry `y`."""
    return _xy([(r, r[y]) for r in records if y in r], x)


def _xy(points: list[tuple[dict[str, Any], Any]], x: str) -> tuple[list[float], list[float]]:
    """The x of each (record, y) and its y; a null (a non-finite number) is a gap."""
    kept = [(r[x], math.nan if y is None else y) for r, y in points if r.get(x) is not None]
    return [p[0] for p in kept], [p[1] for p in kept]


def _byte_unit(largest: float) -> tuple[int, str]:
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if largest >= 1024**power:
            return 1024**power, unit
    return 1, "bytes"
