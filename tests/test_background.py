"""OneInFlight: one job at a time beside the loop, in order, its error raised by wait."""

import threading

import pytest

from pcp_core.program.background import OneInFlight


def test_jobs_run_one_at_a_time_in_order_and_wait_raises_their_error() -> None:
    done: list[int] = []
    release = threading.Event()
    jobs = OneInFlight("test")
    jobs.submit(lambda: (release.wait(), done.append(1)))
    release.set()
    jobs.submit(lambda: done.append(2))  # waits for the first
    jobs.wait()
    assert done == [1, 2]

    def broken() -> None:
        raise OSError("disk gone")

    jobs.submit(broken)
    with pytest.raises(OSError, match="disk gone"):
        jobs.wait()
    jobs.wait()  # raised once
