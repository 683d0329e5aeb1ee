"""Every installed codec's encode and decode speed on one core, against a 1 Gbit/s link.

A pseudo-gradient-like tensor (normal values, a few large ones) of `--values` float32
values is framed and encoded, then decoded, as the worker and the shepherd do
(`pcp_core.codecs.encode_tensor`, `decode_tensor`; error feedback included where the
codec keeps it). Speeds are float32 megabytes per second, the median of `--repeats`;
a codec keeps up with a 1 Gbit/s link when both exceed 125 MB/s. The bytes a value and
the round trip's error are shown beside them. Writes benchmarks/results/codecs/speed.json
and .md.

Then a whole model's pseudo-gradient (GPT-2's tensors, `--model`) through the default
codec, as a worker encodes its Result and the shepherd the downlink's changes: tensor
after tensor, against side by side on the host's cores (`pcp_core.parallel.each`, as PCP
does), the two taking turns `--repeats` times in one run.

    OMP_NUM_THREADS=1 python benchmarks/codec_speed.py            # 16M values (64 MB)
    OMP_NUM_THREADS=1 python benchmarks/codec_speed.py --values 1000000 --repeats 3
"""

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pcp_core import plugins
from pcp_core.codecs import Feedback, decode_tensor
from pcp_core.parallel import each, threads

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


MODELS = {"gpt2-small": (12, 768), "gpt2-medium": (24, 1024), "gpt2-large": (36, 1280)}
MODEL_CODEC = "fp4"  # the default codec


def gpt2_shapes(layers: int, width: int) -> list[tuple[int, ...]]:
    """The shapes of GPT-2's parameters (vocabulary padded to 50304, 1024 positions)."""
    block = [(width,), (width,), (width, 3 * width), (3 * width,), (width, width), (width,)]
    block += [(width,), (width,), (width, 4 * width), (4 * width,), (4 * width, width), (width,)]
    return [(50304, width), (1024, width), *block * layers, (width,), (width,)]


def whole_model(model: str, repeats: int) -> dict:
    """Seconds to encode and decode a model's pseudo-gradient, tensor after tensor and
    side by side (`each`), taking turns; medians."""
    codec = plugins.host().codec(MODEL_CODEC)
    shapes = gpt2_shapes(*MODELS[model])
    tensors = [pseudo_gradient(int(np.prod(shape))).reshape(shape) for shape in shapes]
    elements = sum(t.size for t in tensors)

    def encode(tensor: np.ndarray) -> bytes:
        return Feedback(codec).encode("w", tensor)[0]

    def decode(pair: tuple[bytes, np.ndarray]) -> np.ndarray:
        return decode_tensor(codec, pair[0], pair[1].shape)

    def one_by_one(function: Callable, items: list) -> list:
        return [function(item) for item in items]

    def side_by_side(function: Callable, items: list) -> list:
        return each(function, items, elements)

    ways = {"tensor after tensor": one_by_one, "side by side": side_by_side}
    seconds: dict[str, list[list[float]]] = {way: [[], []] for way in ways}
    for _ in range(repeats):
        for way, run in ways.items():
            started = time.perf_counter()
            encoded = run(encode, tensors)
            middle = time.perf_counter()
            run(decode, list(zip(encoded, tensors, strict=True)))
            seconds[way][0].append(middle - started)
            seconds[way][1].append(time.perf_counter() - middle)
    row: dict = {"model": model, "codec": MODEL_CODEC, "values": elements}
    row["threads"] = threads()
    for way, (encode_s, decode_s) in seconds.items():
        row[way] = {
            "encode_s": statistics.median(encode_s),
            "decode_s": statistics.median(decode_s),
        }
    return row


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


def model_markdown(row: dict) -> str:
    """The whole-model table: seconds each way, and side by side's speed-up."""
    lines = [
        "",
        f"## A whole model: {row['model']}'s {row['values']:,} values through {row['codec']}",
        "",
        f"On {row['threads']} threads (`pcp_core.parallel.each`, one a core, at most "
        "`MAX_THREADS`) against one; medians, the two ways taking turns.",
        "",
        "| way | encode s | decode s |",
        "|---|---|---|",
    ]
    for way in ("tensor after tensor", "side by side"):
        lines.append(f"| {way} | {row[way]['encode_s']:.3f} | {row[way]['decode_s']:.3f} |")
    one, many = row["tensor after tensor"], row["side by side"]
    lines += [
        "",
        f"Side by side: encode {one['encode_s'] / many['encode_s']:.2f}× as fast, decode "
        f"{one['decode_s'] / many['decode_s']:.2f}×.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=16 * 2**20, help="tensor size")
    parser.add_argument("--repeats", type=int, default=5, help="timings per codec")
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2-small")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results folder")
    args = parser.parse_args()
    values = pseudo_gradient(args.values)
    names = sorted(plugins.host().registries["codec"].names())
    rows = []
    for name in names:
        rows.append(measure(name, values, args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    model = whole_model(args.model, args.repeats)
    print(json.dumps(model), flush=True)
    command = "OMP_NUM_THREADS=1 python benchmarks/codec_speed.py" + (
        f" --values {args.values}" if args.values != 16 * 2**20 else ""
    )
    command += f" --model {args.model}" if args.model != "gpt2-small" else ""
    args.results.mkdir(parents=True, exist_ok=True)
    figures = {"codecs": rows, "whole_model": model}
    (args.results / "speed.json").write_text(json.dumps(figures, indent=2) + "\n")
    text = markdown(rows, command, args.values) + model_markdown(model)
    (args.results / "speed.md").write_text(text)
    print(f"wrote {args.results / 'speed.md'}")


if __name__ == "__main__":
    main()
