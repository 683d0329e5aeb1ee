"""Ctrl-C is exit 130 (`run_or_explain`), also when it lands where CPython turns it into
another error: re-taking a Condition's lock, leaving "cannot release un-acquired lock"
with the interrupt as its context (seen once in CI: a shepherd stopped mid-round); and
it waits for a native extension to finish loading (`pcp_core.interrupts`)."""

import signal
import sys

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


SLOW_NATIVE_LIKE_MODULE = """
import os, signal, time
os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the midst of loading
time.sleep(0.2)  # where an extension would still be building its types
LOADED = True
"""


def test_ctrl_c_during_a_held_import_lands_after_it(tmp_path, monkeypatch) -> None:
    """IREE's bindings abort the process on a KeyboardInterrupt raised into their import
    (seen in CI: a docs command stopped as it imported iree.compiler); held back, the
    module loads whole and the interrupt comes after, to the handler that was there."""

    from pcp_core.interrupts import import_holding_ctrl_c

    (tmp_path / "slow_to_load.py").write_text(SLOW_NATIVE_LIKE_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            import_holding_ctrl_c("slow_to_load")
        assert sys.modules["slow_to_load"].LOADED
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.modules.pop("slow_to_load", None)


def test_a_held_import_without_ctrl_c_returns_the_module() -> None:
    from pcp_core.interrupts import import_holding_ctrl_c

    assert import_holding_ctrl_c("json").dumps([1]) == "[1]"
