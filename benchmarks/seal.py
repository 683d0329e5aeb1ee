"""The seal of a message of GPT-2 small's size: one HMAC stream over the bytes (protocol
8) against the HMAC over the digests of 4 MiB chunks hashed on several threads (9).

Every message after the join is sealed by its sender and checked by its receiver
(`pcp_core.wire.channel`), so a round of DiLoCo seals the parameters and the
pseudo-gradient on both sides of each link: four passes over the model. The two ways
take turns on the same float32 tensors; figures are the median of `--repeats`. Writes
benchmarks/results/seal.json and .md.

    python benchmarks/seal.py                  # 124.4M values (GPT-2 small, 498 MB)
    python benchmarks/seal.py --values 10000000 --repeats 3
"""

import argparse
import hashlib
import hmac
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from pcp_core.wire.channel import _encoded, seal_of
from pcp_core.wire.messages import Delta, Tensor

RESULTS = Path(__file__).parent / "results"
KEY = b"k" * 32


def one_stream(key: bytes, sequence: int, message: Delta) -> bytes:
    """Protocol 8's seal: every byte of every tensor through one HMAC stream (without
    the tensors' names and shapes, a few bytes each)."""
    mac = hmac.new(key, sequence.to_bytes(8, "little"), hashlib.sha256)
    for part in _encoded(message, tensors=[]):
        mac.update(part)
    for tensor in message.tensors:
        mac.update(memoryview(tensor.array.reshape(-1).view(np.uint8)))
    return mac.digest()


def gpt2_small_like(values: int) -> Delta:
    """Float32 tensors of 768 x 3072 (an MLP's) and a remainder, `values` in all."""
    rng = np.random.default_rng(0)
    whole, rest = divmod(values, 768 * 3072)
    shapes = [(768, 3072)] * whole + ([(rest,)] if rest else [])
    tensors = [Tensor(f"t{i}", rng.standard_normal(s, np.float32)) for i, s in enumerate(shapes)]
    return Delta(round=0, attempt=0, tensors=tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=124_439_808)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    message = gpt2_small_like(args.values)
    megabytes = sum(t.array.nbytes for t in message.tensors) / 1e6
    times: dict[str, list[float]] = {"one stream (8)": [], "chunk digests (9)": []}
    ways = {"one stream (8)": one_stream, "chunk digests (9)": seal_of}
    for _ in range(args.repeats):
        for name, seal in ways.items():
            started = time.perf_counter()
            seal(KEY, 0, message)
            times[name].append(time.perf_counter() - started)
    rows = {
        name: {"median_s": statistics.median(t), "mb_per_s": megabytes / statistics.median(t)}
        for name, t in times.items()
    }
    ratio = rows["one stream (8)"]["median_s"] / rows["chunk digests (9)"]["median_s"]
    result = {
        "command": f"python benchmarks/seal.py --values {args.values} --repeats {args.repeats}",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "megabytes": round(megabytes, 1),
        "seconds": {name: [round(s, 4) for s in t] for name, t in times.items()},
        "rows": rows,
        "speedup": round(ratio, 2),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "seal.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# Sealing {megabytes:.0f} MB ({result['machine']})",
        "",
        "| seal | median s | MB/s |",
        "|---|---|---|",
        *(f"| {n} | {r['median_s']:.3f} | {r['mb_per_s']:.0f} |" for n, r in rows.items()),
        "",
        f"Chunk digests: {ratio:.2f}x faster. `{result['command']}`",
        "",
    ]
    (RESULTS / "seal.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
