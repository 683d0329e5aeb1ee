"""Every installed codec's encode and decode speed on one core, against a 1 Gbit/s link.

A pseudo-gradient-like tensor (normal values, a few large ones) of `--values` float32
values is framed and encoded, then decoded, as the worker and the shepherd do
(`pcp_core.codecs.encode_tensor`, `decode_tensor`; error feedback included where the
codec keeps it). Speeds are float32 megabytes per second, the median of `--repeats`;
a codec keeps up with a 1 Gbit/s link when both exceed 125 MB/s. The bytes a value and
the round trip's error are shown beside them. Writes benchmarks/results/codecs/speed.json
and .md.

    OMP_NUM_THREADS=1 python benchmarks/codec_speed.py            # 16M values (64 MB)
    OMP_NUM_THREADS=1 python benchmarks/codec_speed.py --values 1000000 --repeats 3
"""

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from pcp_core import plugins
from pcp_core.codecs import Feedback, decode_tensor

RESULTS = Path(__file__).parent / "results" / "codecs"
LINK_MB_S = 125.0  # 1 Gbit/s


def pseudo_gradient(count: int) -> np.ndarray:
    """Normal values with a spike every 10,000, as a round's change often has."""
    values = np.random.default_rng(0).standard_normal(count).astype(np.float32) * 1e-3
    values[::10_000] *= 50
    return values


def measure(name: str, values: np.ndarray, repeats: int) -> dict:
    codec = plugins.host().codec(name)
    encode_s, decode_s = [], []
    for _ in range(repeats):
        feedback = Feedback(codec)  # fresh: each repeat encodes the same first round
        started = time.perf_counter()
        data, _ = feedback.encode("w", values)
        encode_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        decoded = decode_tensor(codec, data, values.shape)
        decode_s.append(time.perf_counter() - started)
    megabytes = values.nbytes / 1e6
    error = np.abs(decoded - values)
    return {
        "codec": name,
        "bytes_per_value": round(len(data) / values.size, 4),
        "encode_mb_s": round(megabytes / statistics.median(encode_s), 1),
        "decode_mb_s": round(megabytes / statistics.median(decode_s), 1),
        "relative_rms_error": float(np.sqrt(np.mean(error**2) / np.mean(values**2))),
    }


def markdown(rows: list[dict], command: str, count: int) -> str:
    lines = [
        "# Codec speed on one core (benchmarks/codec_speed.py)",
        "",
        f"```\n{command}\n```",
        "",
        f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
        f"{count:,} float32 values; 1 Gbit/s is {LINK_MB_S:g} MB/s of float32.",
        "",
        "| codec | bytes a value | encode MB/s | decode MB/s | vs 1 Gbit/s (slower side) "
        "| relative RMS error |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        slower = min(row["encode_mb_s"], row["decode_mb_s"]) / LINK_MB_S
        lines.append(
            f"| {row['codec']} | {row['bytes_per_value']} | {row['encode_mb_s']} "
            f"| {row['decode_mb_s']} | {slower:.1f}× | {row['relative_rms_error']:.2e} |"
        )
    lines += [
        "",
        "Encode includes the framing, the decode the worker makes for the norm it "
        "announces, and error feedback where the codec keeps it (topk); MB/s of float32 "
        "input. The error is of one round trip, without feedback's later correction.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=16 * 2**20, help="tensor size")
    parser.add_argument("--repeats", type=int, default=5, help="timings per codec")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results folder")
    args = parser.parse_args()
    values = pseudo_gradient(args.values)
    names = sorted(plugins.host().registries["codec"].names())
    rows = []
    for name in names:
        rows.append(measure(name, values, args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    command = "OMP_NUM_THREADS=1 python benchmarks/codec_speed.py" + (
        f" --values {args.values}" if args.values != 16 * 2**20 else ""
    )
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "speed.json").write_text(json.dumps(rows, indent=2) + "\n")
    (args.results / "speed.md").write_text(markdown(rows, command, args.values))
    print(f"wrote {args.results / 'speed.md'}")


if __name__ == "__main__":
    main()
