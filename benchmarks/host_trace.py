"""Where the host's time goes around PCP's `xla` calls: jax's profiler over two calls queued
back to back, summarised as text.

torch's profiler (torch_anchor's kernel tables) sees the GPU's work and the CUDA calls, not
what jax and PJRT do between them. This trace has both: the host threads' ranges
(`PjitFunction`, PJRT's execute and transfer steps, XLA's thunks) and the device's
streams. The GPU sits idle about 3 ms at each edge of a call
(benchmarks/results/gpu/h200/2026-11-29-b32-profile); the report lines up the device's
idle stretches with what each host thread did meanwhile.
"""

import gzip
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def trace_two_calls(executor: Any, inputs: Any, targets: Any, keep: Path | None = None) -> str:
    """Two calls of `executor` (an XlaExecutor) queued back to back and then waited for,
    under jax's profiler; the report of `report`. With `keep`, the Perfetto trace is
    copied there."""
    import jax

    with tempfile.TemporaryDirectory() as scratch:
        with jax.profiler.trace(scratch, create_perfetto_trace=True):
            first = executor.dispatch(inputs, targets)
            second = executor.dispatch(inputs, targets)
            first(), second()
        found = sorted(Path(scratch).rglob("perfetto_trace.json.gz"))
        if not found:
            return "jax's profiler wrote no Perfetto trace\n"
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_bytes(found[-1].read_bytes())
        events = json.loads(gzip.decompress(found[-1].read_bytes())).get("traceEvents", [])
    return report(events)


def report(events: list[dict[str, Any]], rows: int = 60, idle_us: float = 300.0) -> str:
    """From a Perfetto/Chrome trace of jax's profiler: the device's idle stretches of at
    least `idle_us`, each with the host ranges that overlap it; then the host's ranges by
    total time."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    threads = {
        (e["pid"], e.get("tid")): e["args"]["name"]
        for e in events
        if e.get("name") == "thread_name"
    }
    ranges = [e for e in events if e.get("ph") == "X" and "dur" in e]
    host = [e for e in ranges if names.get(e["pid"], "").startswith("/host")]
    on_device = [e for e in ranges if names.get(e["pid"], "").startswith("/device")]
    # the streams' kernels and copies, not the module and op lines that span them
    streams = [
        e for e in on_device if threads.get((e["pid"], e.get("tid")), "").startswith("Stream")
    ]
    device = sorted(streams or on_device, key=lambda e: e["ts"])
    if not ranges:
        return "no ranges in the trace\n"
    origin = min(e["ts"] for e in ranges)
    lines = [f"trace: {len(host)} host ranges, {len(device)} device ranges; times in us"]

    def where(e: dict[str, Any]) -> str:
        return threads.get((e["pid"], e.get("tid")), str(e.get("tid")))[:28]

    for start, end in idle_stretches(device, idle_us):
        lines.append(
            f"device idle {start - origin:10.1f} .. {end - origin:10.1f} ({end - start:.1f})"
        )
        overlapping = [e for e in host if e["ts"] < end and e["ts"] + e["dur"] > start]
        for e in sorted(overlapping, key=lambda e: e["ts"])[:rows]:
            lines.append(
                f"    {e['ts'] - origin:10.1f} | {e['dur']:9.1f} | {where(e):28} | {e['name'][:60]}"
            )
    totals: dict[str, tuple[int, float]] = {}
    for e in host:
        count, total = totals.get(e["name"], (0, 0.0))
        totals[e["name"]] = (count + 1, total + e["dur"])
    lines.append("host ranges by total time: total (us) | count | name")
    worst = sorted(totals.items(), key=lambda item: -item[1][1])[:rows]
    lines += [f"{total:12.1f} | {count:6d} | {name[:80]}" for name, (count, total) in worst]
    return "\n".join(lines) + "\n"


def idle_stretches(device: list[dict[str, Any]], idle_us: float) -> list[tuple[float, float]]:
    """The stretches of at least `idle_us` in which no device range runs (on any stream),
    from the first device range's start to the last one's end."""
    return [
        (idle_from, e["ts"]) for idle_from, e in waits(device) if e["ts"] - idle_from >= idle_us
    ]


def waits(ranges: list[dict[str, Any]]) -> Iterator[tuple[float, dict[str, Any]]]:
    """Each range of `ranges` (sorted by start; on one stream or several) with the time
    from which the device had nothing else running before it: the end of all ranges
    before it (its own start for the first). A gap where that is before its start."""
    busy_until = ranges[0]["ts"] if ranges else 0.0
    for e in ranges:
        yield busy_until, e
        busy_until = max(busy_until, e["ts"] + e.get("dur", 0))
