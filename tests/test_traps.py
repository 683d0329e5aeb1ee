"""What a new user tripped over, each fixed: `pcp`'s own options after the command, one
port for the shepherd whoever starts it, a warning where a precision is far slower on the
device, a `--data` directory of inputs answered with the command that works, and help,
tables and the dashboard readable at 80 columns without a cut word."""

import inspect
from pathlib import Path

import pytest

from pcp_core.cli import launch
from pcp_core.cli.app import hoisted
from pcp_core.shepherd_settings import DEFAULT_PORT
from pcp_core.watch.dashboard import render
from tests.conftest import run_pcp
from tests.test_watching import a_run, text_of

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16"]


def test_pcps_own_options_are_taken_after_the_command() -> None:
    assert hoisted(["train", "--log-format", "json", "--steps", "5"]) == [
        "--log-format", "json", "train", "--steps", "5",
    ]  # fmt: skip
    assert hoisted(["train", "--log-format=console", "--verbose"]) == [
        "--log-format=console", "--verbose", "train",
    ]  # fmt: skip
    assert hoisted(["sample", "run", "--", "--verbose"]) == ["sample", "run", "--", "--verbose"]


def test_a_late_log_format_is_used(tmp_path: Path) -> None:
    result = run_pcp(
        *("train", "--steps", "10", "--eval-every", "0", *TINY, "--out", str(tmp_path / "run")),
        *("--log-format", "json"),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.lstrip().startswith("{")


def test_pcp_launch_and_pcp_shepherd_share_a_default_port() -> None:
    (port,) = [p for p in inspect.signature(launch.launch).parameters.values() if p.name == "port"]
    assert port.default.default == DEFAULT_PORT


def test_a_far_slower_precision_is_said_once(tmp_path: Path) -> None:
    result = run_pcp(
        *("train", "--precision", "bf16", "--steps", "10", "--eval-every", "0", *TINY),
        *("--out", str(tmp_path / "run")),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count("--precision bf16 on cpu runs far slower than f32") == 1


def test_a_data_directory_of_inputs_is_answered_with_the_command_that_works(
    tmp_path: Path,
) -> None:
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text("It was a bright cold day in April. " * 200)
    result = run_pcp("train", "--data", str(books), "--out", str(tmp_path / "run"))
    assert result.returncode != 0
    suggested = f"pcp data prepare {books} -o {books}-prepared"
    assert suggested in result.stderr
    prepared = run_pcp(*suggested.split()[1:])
    assert prepared.returncode == 0, prepared.stderr[-2000:]


@pytest.mark.parametrize(
    "command", [["train", "--help"], ["shepherd", "--help"], ["worker", "--help"], ["devices"]]
)
def test_nothing_is_cut_at_80_columns(command: list[str]) -> None:
    result = run_pcp(*command, env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "…" not in result.stdout, [line for line in result.stdout.splitlines() if "…" in line]


def test_the_dashboard_at_80_columns() -> None:
    screen = text_of(render(a_run().snapshot(), 80), 80)
    assert "…" not in screen, screen
    assert "loss" in screen and "state" in screen
