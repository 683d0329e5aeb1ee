"""How much of its link a node used: its interface's byte counters, sampled while a
rehearsal runs, and the share of the configured rate its busy periods reached.

The harness starts `python -m pcp_core.rehearsal.counters eth0 FILE INTERVAL` in the
shepherd's namespace (`ip netns exec` mounts that namespace's /sys), which appends
`time tx_bytes rx_bytes` every INTERVAL seconds until it is terminated. The counters
count whole frames as `tbf` does (Ethernet and IP headers included), so a link used to
the full shows its configured rate.

A transfer phase is a run of intervals in which the link carried at least BUSY_SHARE of
its rate; `link_use` reports, each way, the median and the mean of the rate over those
intervals as a share of the configured rate, and how long they lasted. The median is
the figure to judge by: the mean also counts the partly filled first and last interval
of every phase.
"""

from __future__ import annotations

import itertools
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BUSY_SHARE = 0.1  # an interval at or above this share of the rate is part of a transfer
INTERVAL_S = 0.05


def read_counters(interface: str) -> tuple[int, int]:
    """The interface's transmitted and received bytes so far."""
    base = Path("/sys/class/net") / interface / "statistics"
    return int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text())


def sample(interface: str, path: Path, interval_s: float) -> None:
    """Append `time tx rx` lines to `path` every `interval_s` until SIGTERM or SIGINT."""
    stop = False

    def finish(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    with path.open("a") as out:
        next_at = time.monotonic()
        while not stop:
            tx, rx = read_counters(interface)
            out.write(f"{time.monotonic():.4f} {tx} {rx}\n")
            out.flush()
            next_at += interval_s
            time.sleep(max(0.0, next_at - time.monotonic()))


def read_samples(path: Path) -> list[tuple[float, int, int]]:
    """The samples a `sample` run wrote (a cut last line is skipped)."""
    samples = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) == 3:
            samples.append((float(fields[0]), int(fields[1]), int(fields[2])))
    return samples


def link_use(samples: list[tuple[float, int, int]], rate_mbit: float) -> dict[str, Any]:
    """Each way ("sent" by the node, "received" by it): the median and mean share of
    `rate_mbit` over the intervals of its transfer phases, and their total seconds."""
    rate_bytes = rate_mbit * 1e6 / 8
    use: dict[str, Any] = {}
    for way, column in (("sent", 1), ("received", 2)):
        shares, busy_s = [], 0.0
        for before, after in itertools.pairwise(samples):
            seconds = after[0] - before[0]
            if seconds <= 0:
                continue
            share = (after[column] - before[column]) / seconds / rate_bytes
            if share >= BUSY_SHARE:
                shares.append(share)
                busy_s += seconds
        use[way] = {
            "median": round(statistics.median(shares), 4) if shares else None,
            "mean": round(statistics.fmean(shares), 4) if shares else None,
            "busy_s": round(busy_s, 3),
        }
    return use


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m pcp_core.rehearsal.counters INTERFACE FILE INTERVAL_S")
        return 2
    sample(argv[0], Path(argv[1]), float(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
