"""The GPU's SM clock and power draw through a benchmark, sampled by `nvidia-smi`, and
shared out to the calls that ran while each sample was taken.

At large batches an H200 holds GPT-2 small's step at its power cap by lowering its clock,
so two programs that take the same GPU cycles differ in time by what they cost in energy
(benchmarks/results/gpu/h200/2026-11-29-edges). `torch_anchor.py --power` reports, for
each way, the median SM clock and mean power over its timed calls and the joules a step.
"""

import statistics
import subprocess
import threading
from datetime import datetime
from typing import Any

QUERY = "timestamp,clocks.sm,power.draw"
TIMESTAMP = "%Y/%m/%d %H:%M:%S.%f"  # nvidia-smi's, in local time as time.time() reads it


class PowerSampler:
    """`nvidia-smi` sampling device `device` every `interval_ms` while the `with` block
    runs; `samples` holds (seconds since the epoch, SM MHz, watts)."""

    def __init__(self, device: int = 0, interval_ms: int = 50) -> None:
        self.command = [
            "nvidia-smi",
            f"--query-gpu={QUERY}",
            "--format=csv,noheader,nounits",
            *("-lms", str(interval_ms)),
            *("-i", str(device)),
        ]
        self.samples: list[tuple[float, float, float]] = []
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> "PowerSampler":
        self._process = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None and self._reader is not None
        self._process.terminate()
        self._process.wait()
        self._reader.join()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            sample = parse(line)
            if sample is not None:
                self.samples.append(sample)


def parse(line: str) -> tuple[float, float, float] | None:
    """One line of `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits` as
    (epoch seconds, SM MHz, watts); None for a line without all three (a field the
    driver reports as "[N/A]")."""
    fields = [field.strip() for field in line.split(",")]
    if len(fields) != 3:
        return None
    try:
        when = datetime.strptime(fields[0], TIMESTAMP).timestamp()
        return when, float(fields[1]), float(fields[2])
    except ValueError:
        return None


def during(
    samples: list[tuple[float, float, float]], windows: list[tuple[float, float]]
) -> dict[str, Any] | None:
    """The samples taken inside any of `windows` (start, end in epoch seconds): their
    count, median SM clock and mean power; None if there are none."""
    inside = [s for s in samples if any(start <= s[0] <= end for start, end in windows)]
    if not inside:
        return None
    return {
        "power_samples": len(inside),
        "sm_mhz_median": statistics.median(s[1] for s in inside),
        "power_w_mean": round(statistics.fmean(s[2] for s in inside), 1),
    }
