"""Ctrl-C is exit 130 (`run_or_explain`), also when it lands where CPython turns it into
another error: re-taking a Condition's lock, leaving "cannot release un-acquired lock"
with the interrupt as its context (seen once in CI: a shepherd stopped mid-round)."""

import contextlib
import os
import signal

import pytest
import typer

from pcp_core import exit_codes
from pcp_core.cli.common import run_or_explain


def ctrl_c_breaking_a_lock() -> None:
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        raise RuntimeError("cannot release un-acquired lock")  # noqa: B904 (as CPython does)


def plain_ctrl_c() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("body", [plain_ctrl_c, ctrl_c_breaking_a_lock])
def test_ctrl_c_is_exit_130(body, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as ended:
        run_or_explain(body)
    assert ended.value.exit_code == exit_codes.INTERRUPTED == 130
    assert "interrupted" in capsys.readouterr().err


def test_another_runtime_error_is_not_taken_for_ctrl_c() -> None:
    def broken() -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_or_explain(broken)


def test_a_user_error_that_is_a_runtime_error_is_still_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pcp_core.backends import DeviceError

    def no_device() -> None:
        raise DeviceError("no device 3")

    with pytest.raises(typer.Exit) as ended:
        run_or_explain(no_device)
    assert ended.value.exit_code == exit_codes.CONFIGURATION
    assert capsys.readouterr().err == "error: no device 3\n"


def test_an_error_a_ctrl_c_left_without_the_interrupt_is_still_exit_130(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The interrupt lost on the way (as an extension module's import may lose it): the
    SIGINT itself was seen, so the command still ends as interrupted."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupted_import() -> None:
        with contextlib.suppress(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # its handler raises here
        raise ImportError("initialization of _mlir failed")

    try:
        with pytest.raises(typer.Exit) as ended:
            run_or_explain(interrupted_import)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ended.value.exit_code == exit_codes.INTERRUPTED
    assert "interrupted" in capsys.readouterr().err
