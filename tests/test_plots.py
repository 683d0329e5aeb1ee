"""loss.png: the lines drawn (read back through matplotlib), the image written, `pcp plot`."""

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from pcp_core.watch import plots
from tests.conftest import run_pcp

LOCAL = [
    {"step": 10, "loss": 3.7, "loss_mean": 3.8, "tokens": 640, "elapsed_s": 1.0, "val_loss": 3.6},
    {"step": 20, "loss": 3.3, "loss_mean": 3.5, "tokens": 1280, "elapsed_s": 2.0},
    {"step": 30, "loss": None, "loss_mean": 3.1, "tokens": 1920, "elapsed_s": 3.0},
    {"step": 40, "loss": 2.9, "loss_mean": 3.0, "tokens": 2560, "elapsed_s": 4.0, "val_loss": 2.8},
]


def diloco_record(index: int, losses: dict[str, float], **extra: Any) -> dict[str, Any]:
    """A shepherd's record of round `index` (pcp_diloco.shepherd_side writes these)."""
    return {
        "round": index,
        "step": 20 * (index + 1),
        "loss": sum(losses.values()) / len(losses),
        "worker_losses": losses,
        "workers": len(losses),
        "tokens": 40960 * (index + 1),
        "elapsed_s": 2.0 * index,
        "bytes_sent": 864384,
        "bytes_received": 864720,
        "round_s": 2.0,
        "compute_s": 1.5 + index / 10,
        "communication_s": 0.5,
        "compute_utilisation": 0.5 + index / 10,
        "run_compute_utilisation": 0.6,
        **extra,
    }


DILOCO = [
    diloco_record(0, {"0": 3.2, "1": 3.0}),
    diloco_record(1, {"0": 2.4}, val_loss=2.3),  # worker 1 missed this round
    diloco_record(2, {"0": 2.0, "1": 2.2}, val_loss=2.1),
]


def lines(figure: Any, panel: str) -> dict[str, tuple[list[float], list[float]]]:
    """The panel's lines by legend label, as (x, y) lists."""
    (ax,) = [ax for ax in figure.axes if ax.get_label() == panel]
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
    }


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking its signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def write_run(run_dir: Path, records: list[dict[str, Any]], config: str = "") -> Path:
    run_dir.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in records)
    (run_dir / "metrics.jsonl").write_text(text)
    if config:
        (run_dir / "config.toml").write_text(config)
    return run_dir


def test_local_run_has_one_panel_with_train_and_validation() -> None:
    figure = plots.loss_figure(LOCAL, "run")
    assert [ax.get_label() for ax in figure.axes] == ["loss"]
    drawn = lines(figure, "loss")
    assert list(drawn) == ["train", "validation"]
    x, y = drawn["train"]
    assert x == [640, 1280, 1920, 2560]
    assert y[:2] == [3.7, 3.3] and math.isnan(y[2]) and y[3] == 2.9  # a null is a gap
    assert drawn["validation"] == ([640, 2560], [3.6, 2.8])


def test_diloco_run_has_a_line_per_worker_and_round_panels() -> None:
    figure = plots.loss_figure(DILOCO, "run")
    labels = sorted(ax.get_label() for ax in figure.axes)
    assert labels == ["bytes", "loss", "time", "utilisation"]
    drawn = lines(figure, "loss")
    assert list(drawn) == ["worker 0", "worker 1", "train (mean over workers)", "validation"]
    assert drawn["worker 0"] == ([40960, 81920, 122880], [3.2, 2.4, 2.0])
    assert drawn["worker 1"] == ([40960, 122880], [3.0, 2.2])
    assert drawn["train (mean over workers)"][0] == [40960, 81920, 122880]
    assert drawn["validation"] == ([81920, 122880], [2.3, 2.1])

    sent = lines(figure, "bytes")
    assert sent["sent"] == ([0, 1, 2], [864384 / 1024] * 3)
    assert sent["received"] == ([0, 1, 2], [864720 / 1024] * 3)
    (ax,) = [ax for ax in figure.axes if ax.get_label() == "bytes"]
    assert ax.get_ylabel() == "KiB per round"
    time = lines(figure, "time")
    assert time["compute (slowest worker)"] == ([0, 1, 2], [1.5, 1.6, 1.7])
    assert time["communication"] == ([0, 1, 2], [0.5] * 3)
    assert lines(figure, "utilisation")["utilisation"] == ([0, 1, 2], [50.0, 60.0, 70.0])
    (ax,) = [ax for ax in figure.axes if ax.get_label() == "time"]
    assert ax.get_title() == "time per round; compute utilisation 60% over the run"


def test_encoded_pseudo_gradients_add_their_float32_size_to_the_bytes_panel() -> None:
    records = [
        diloco_record(r, {"0": 3.0 - r}, pseudo_gradient_bytes=220_000,
                      pseudo_gradient_raw_bytes=864_720)
        for r in range(3)
    ]  # fmt: skip
    drawn = lines(plots.loss_figure(records, "run"), "bytes")
    assert drawn["received as float32"] == ([0, 1, 2], [864720 / 1024] * 3)
    assert "received as float32" not in lines(plots.loss_figure(DILOCO, "run"), "bytes")


@pytest.mark.parametrize(
    ("records", "config", "size", "title"),
    [
        (LOCAL, 'algorithm = "local"\nbackend = "cpu"\n', (1200, 500), "run: local on cpu"),
        (
            DILOCO,
            'algorithm = "diloco"\nbackend = "cpu"\n[shepherd]\nworkers = 3\n',
            (1200, 800),
            "run: diloco, 3 workers on cpu",
        ),
        (  # a run written before plugin API 5
            DILOCO,
            'algorithm = "diloco"\nbackend = "cpu"\nworkers = 2\n',
            (1200, 800),
            "run: diloco, 2 workers on cpu",
        ),
        (LOCAL, "", (1200, 500), "run"),  # no config.toml: the name alone
    ],
)
def test_png_has_the_documented_size_and_title(
    tmp_path: Path, records: list[dict[str, Any]], config: str, size: tuple[int, int], title: str
) -> None:
    run_dir = write_run(tmp_path / "run", records, config)
    assert plots.run_title(run_dir) == title
    path = plots.plot_run(run_dir)
    assert path == run_dir / "loss.png"
    assert png_size(path) == size


def test_a_half_written_last_line_is_skipped(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", LOCAL)
    with (run_dir / "metrics.jsonl").open("a") as file:
        file.write('{"step": 50, "loss": 2.')
    assert plots.read_records(run_dir) == LOCAL


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "no such run directory"),
        (lambda d: d.mkdir(), "has no metrics.jsonl"),
        (lambda d: write_run(d, []), "has no records yet"),
        (
            lambda d: write_run(d, LOCAL[:1]).joinpath("metrics.jsonl").write_text("{}\nx\n{}\n"),
            "line 2 is not JSON",
        ),
        (
            lambda d: write_run(d, []).joinpath("metrics.jsonl").write_text("[1]\n"),
            "line 1 is not a JSON object",
        ),
    ],
)
def test_bad_run_directories_are_one_line_errors(tmp_path: Path, make: Any, message: str) -> None:
    make(tmp_path / "run")
    with pytest.raises(plots.PlotError, match=message):
        plots.plot_run(tmp_path / "run")


def test_the_end_of_run_plot_never_fails(tmp_path: Path) -> None:
    with capture_logs() as logs:
        assert plots.write_loss_png(tmp_path / "missing") is None
    assert logs[0]["event"] == "loss.png not written" and logs[0]["log_level"] == "warning"
    assert "no such run directory" in logs[0]["error"]


@pytest.mark.slow  # the training compiles a program: about a minute on two loaded cores
def test_pcp_plot_on_a_real_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    tiny = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16"]
    steps = ["--batch-size", "4", "--steps", "20", "--steps-per-call", "10", "--eval-every", "10"]
    trained = run_pcp("train", "--backend", "cpu", *tiny, *steps, "--out", str(out))
    assert trained.returncode == 0, trained.stderr
    result = run_pcp("plot", str(out), "-o", str(tmp_path / "plot.png"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "plot.png")
    assert png_size(tmp_path / "plot.png") == (1200, 500)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: None, "no such run directory"),
        (lambda d: write_run(d, []), "has no records yet"),
    ],
)
def test_pcp_plot_bad_input_is_one_line(tmp_path: Path, make: Any, message: str) -> None:
    make(tmp_path / "run")
    result = run_pcp("plot", str(tmp_path / "run"))
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert message in result.stderr and "Traceback" not in result.stderr
