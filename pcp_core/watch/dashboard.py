"""The live dashboard `pcp train` and `pcp shepherd` show on a terminal.

A view of `RunStatus` redrawn in place by rich's `Live` on its own thread, twice a second:
the run (state, round, step, tokens/s, ETA), the workers table, a chart of the train and
validation loss, and for a distributed run the bytes and the compute and communication
time of the last round. Training never waits for it: each redraw works on a snapshot.
Log lines print above it.
"""

import math
from types import TracebackType
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from pcp_core.program.footprint import human_bytes, human_count
from pcp_core.watch.run_status import RunStatus

REFRESH_PER_S = 2
CHART_HEIGHT = 8  # rows of the loss chart
STATE_STYLES = {
    "joining": "cyan",
    "restarting": "yellow",
    "compiling": "cyan",
    "ready": "white",
    "training": "green",
    "reporting": "blue",
    "dead": "bold red",
    "quarantined": "bold magenta",
}
TRAIN_STYLE, VAL_STYLE = "green", "magenta"


class Dashboard:
    """Shows `status` live while the `with` block runs."""

    def __init__(self, status: RunStatus, console: Console | None = None) -> None:
        self.status = status
        self.console = console or Console(stderr=True)
        self._live = Live(
            get_renderable=self.render,
            console=self.console,
            refresh_per_second=REFRESH_PER_S,
            redirect_stdout=True,
            redirect_stderr=True,
        )

    def __enter__(self) -> "Dashboard":
        self._live.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._live.stop()  # draws the last state, which stays on the screen

    def render(self) -> RenderableType:
        return render(self.status.snapshot(), self.console.size.width)


def render(snapshot: dict[str, Any], width: int = 100) -> RenderableType:
    """The whole dashboard for one snapshot (a pure function, so tests can call it)."""
    run = snapshot["run"]
    parts: list[RenderableType] = [_header(run), _workers(snapshot, width)]
    parts.append(_loss_chart(snapshot["history"], run, max(width - 16, 20)))
    if run.get("last_round"):
        parts.append(_communication(run))
    return Group(*parts)


def _header(run: dict[str, Any]) -> Panel:
    title = " · ".join(
        str(x) for x in ("PCP", run.get("algorithm"), run.get("backend"), run.get("model")) if x
    )
    if run.get("parameters"):
        title += f" · {human_count(run['parameters'])} parameters"
    step, total = run["step"], run["total_steps"]
    facts = Text()
    if run.get("rounds"):
        shown = -1 if run["round"] is None else run["round"]
        facts.append(f"round {shown + 1}/{run['rounds']}   ")
    facts.append(f"step {step:,}/{total:,}   " if total else f"step {step:,}   ")
    facts.append(f"tokens {human_count(run['tokens'])}   ")
    if run.get("tokens_per_s"):
        facts.append(f"{run['tokens_per_s']:,.0f} tok/s   ")
    facts.append(f"elapsed {_duration(run['elapsed_s'])}   ")
    facts.append(f"ETA {_duration(run['eta_s'])}")
    if run.get("status_url"):
        facts.append(f"   {run['status_url']}")
    bar = ProgressBar(total=max(total, 1), completed=min(step, max(total, 1)))
    state = Text(run["state"], style="bold " + ("red" if run["state"] == "failed" else "green"))
    return Panel(Group(facts, bar), title=title, subtitle=state, title_align="left")


# The workers table's columns (name, right-aligned); below WIDE_COLUMNS of terminal, the
# narrow set, so that at 80 columns nothing is cut
COLUMNS = (
    ("#", False), ("name", False), ("backend/arch", False), ("address", False),
    ("state", False), ("inner step", False), ("loss", True), ("steps/s", True),
    ("tok/s", True), ("compute/wait/send", True), ("rounds", True), ("heard", True),
)  # fmt: skip
NARROW = ("#", "name", "state", "inner step", "loss", "tok/s", "heard")
WIDE_COLUMNS = 120


def _workers(snapshot: dict[str, Any], width: int) -> Table:
    shown = [c for c in COLUMNS if width >= WIDE_COLUMNS or c[0] in NARROW]
    table = Table(title="workers", title_justify="left", expand=True, pad_edge=False)
    for column, right in shown:
        table.add_column(column, justify="right" if right else "left", overflow="fold")
    for w in snapshot["workers"]:
        step = "" if w["inner_step"] is None else f"~{w['inner_step']}/{w['inner_steps']}"
        heard = "" if w["last_heard_s"] is None else f"{w['last_heard_s']:.0f}s ago"
        cells = {
            "#": str(w["index"]),
            "name": w["name"],
            "backend/arch": f"{w['backend']}/{w['arch']}",
            "address": w["address"],
            "state": Text(w["state"], style=STATE_STYLES.get(w["state"], "")),
            "inner step": step,
            "loss": _number(w["loss"], "{:.4f}"),
            "steps/s": _number(w["steps_per_s"], "{:.1f}"),
            "tok/s": _number(w["tokens_per_s"], "{:,.0f}"),
            "compute/wait/send": _times(w),
            "rounds": str(w["rounds"]),
            "heard": heard,
        }
        table.add_row(*(cells[column] for column, _ in shown))
    if not snapshot["workers"]:
        table.add_row("", Text("waiting for workers", style="dim"), *[""] * (len(shown) - 2))
    return table


def _times(worker: dict[str, Any]) -> str:
    """Its last round's seconds computing, waiting for the shepherd and sending."""
    keys = ("compute_s", "wait_s", "send_s")
    if any(worker.get(key) is None for key in keys):
        return ""
    times = [worker[key] for key in keys]
    if max(times) < 1:  # short rounds: milliseconds, which tenths of a second would hide
        return "/".join(f"{1000 * t:.0f}" for t in times) + "ms"
    return "/".join(f"{t:.1f}" for t in times) + "s"


def _loss_chart(history: list[dict[str, Any]], run: dict[str, Any], width: int) -> Panel:
    train = [(p["tokens"], p["loss"]) for p in history if p["loss"] is not None]
    val = [(p["tokens"], p["val_loss"]) for p in history if p["val_loss"] is not None]
    legend = Text()
    legend.append("━ train", style=TRAIN_STYLE)
    legend.append(f" {_number(run.get('loss'), '{:.4f}')}   ")
    legend.append("━ validation", style=VAL_STYLE)
    legend.append(f" {_number(run.get('val_loss'), '{:.4f}')}   ")
    legend.append("x: tokens", style="dim")
    if len(train) < 2:
        body: RenderableType = Text("the chart starts after the second report", style="dim")
    else:
        body = braille_chart([(train, TRAIN_STYLE), (val, VAL_STYLE)], width, CHART_HEIGHT)
    return Panel(Group(legend, body), title="loss", title_align="left")


def _communication(run: dict[str, Any]) -> Panel:
    last = run["last_round"]
    compute, comm = last.get("compute_s") or 0.0, last.get("communication_s") or 0.0
    share = compute / (compute + comm) if compute + comm > 0 else 0.0
    text = Text()
    text.append(f"last round: sent {human_bytes(last.get('bytes_sent') or 0)}, ")
    text.append(f"received {human_bytes(last.get('bytes_received') or 0)}   ")
    text.append(f"compute {compute:.2f}s", style="green")
    text.append(" / ")
    text.append(f"communication {comm:.2f}s", style="blue")
    text.append(f"   all rounds: sent {human_bytes(run['bytes_sent'])}, ")
    text.append(f"received {human_bytes(run['bytes_received'])}")
    encoded, raw = last.get("pseudo_gradient_bytes"), last.get("pseudo_gradient_raw_bytes")
    if encoded and raw and encoded != raw:
        text.append(f"   pseudo-gradients encoded {human_bytes(encoded)} of {human_bytes(raw)} ")
        text.append(f"({raw / encoded:.1f}x; encode {last.get('encode_s') or 0:.2f}s, ")
        text.append(f"decode {last.get('decode_s') or 0:.2f}s)")
    if run.get("compute_utilisation") is not None:
        text.append("   compute utilisation ")
        text.append(f"{_number(last.get('compute_utilisation'), '{:.0%}')} last round, ")
        text.append(f"{run['compute_utilisation']:.0%} so far", style="bold")
    bar = ProgressBar(total=100, completed=share * 100, complete_style="green", style="blue")
    return Panel(Group(text, bar), title="rounds: compute vs communication", title_align="left")


# -- a line chart in braille cells (2 x 4 dots each) ------------------------------------

BRAILLE_BASE = 0x2800
DOT_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))  # [row][column]


def braille_chart(
    series: list[tuple[list[tuple[float, float]], str]], width: int, height: int
) -> Text:
    """Lines through each series' (x, y) points on one scale, `width` x `height` cells,
    with the y range on the left. A cell where two series meet takes the later's style."""
    points = [p for values, _ in series for p in values]
    xs, ys = [x for x, _ in points], [y for _, y in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    label_width = 8
    columns, rows = max(width - label_width, 4), height
    dots_x, dots_y = columns * 2, rows * 4
    cells = [[0] * columns for _ in range(rows)]
    styles: list[list[str | None]] = [[None] * columns for _ in range(rows)]

    def to_dot(x: float, y: float) -> tuple[int, int]:
        dx = 0 if x1 == x0 else round((x - x0) / (x1 - x0) * (dots_x - 1))
        dy = 0 if y1 == y0 else round((y1 - y) / (y1 - y0) * (dots_y - 1))
        return dx, dy

    for values, style in series:
        dots = [to_dot(x, y) for x, y in sorted(values)]
        for (ax, ay), (bx, by) in zip(dots, dots[1:] or dots, strict=False):
            steps = max(abs(bx - ax), abs(by - ay), 1)
            for i in range(steps + 1):
                dx, dy = round(ax + (bx - ax) * i / steps), round(ay + (by - ay) * i / steps)
                row, column = dy // 4, dx // 2
                cells[row][column] |= DOT_BITS[dy % 4][dx % 2]
                styles[row][column] = style
    chart = Text()
    for row in range(rows):
        label = f"{y1:.3f}" if row == 0 else f"{y0:.3f}" if row == rows - 1 else ""
        chart.append(label.rjust(label_width - 1) + "┤", style="dim")
        for column in range(columns):
            bits = cells[row][column]
            chart.append(chr(BRAILLE_BASE + bits) if bits else " ", style=styles[row][column])
        chart.append("\n")
    first, last = human_count(int(x0)), human_count(int(x1))
    chart.append(" " * label_width + first.ljust(columns - 8) + last.rjust(8))
    return chart


# -- formatting -------------------------------------------------------------------------


def _number(value: float | None, form: str) -> str:
    return "" if value is None or not math.isfinite(value) else form.format(value)


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "--:--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
