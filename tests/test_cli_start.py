"""What `pcp shepherd`, `pcp train` and `pcp worker` refuse at the start: one line, exit 2."""

import pytest

from tests.conftest import run_pcp


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-1"])
def test_worker_timeout_must_be_a_positive_number(timeout: str) -> None:
    result = run_pcp("worker", "--connect", "127.0.0.1:9", "--timeout", timeout)
    assert result.returncode == 2, result.stderr
    assert "--timeout must be a positive number of seconds" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
