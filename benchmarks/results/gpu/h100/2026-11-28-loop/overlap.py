"""What a checkpoint on a thread costs a GPU loop beside it, by how it reads the arrays.

A stand-in for `pcp train`'s loop: one jitted call of about 37 ms (bf16 matrix products)
after another, each read back (`np.asarray` of a scalar) before the next is dispatched,
as `XlaExecutor.run` does. At call 5 a snapshot of 148 arrays shaped as GPT-2 small's
parameters (124.5M f32, 500 MB) is taken on the device and a thread reads it to the host
and writes a checkpoint (`pcp_core.program.checkpoint.save`), in one of these ways:

- `asarray`: the thread reads each array with `np.asarray` (the loop before issue 32's
  last change);
- `async`: the reads are started (`copy_to_host_async`) as the snapshot is taken, and
  the thread's `np.asarray` picks up the bytes;
- `pinned`: the snapshot is put in pinned host memory (`device_put`, memory kind
  `pinned_host`), and the thread reads those;
- `*-read`: the reads alone, no write; `write`: the write alone, of host arrays.

Prints, per way, the loop's extra time over the same calls without a thread, the thread's
own time and the longest gap of a 1 ms ticker on a third thread (how long the interpreter
was held). One JSON line a way; `--out` appends them to a file.
"""

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from pcp_core.program.checkpoint import save

CALLS, SNAPSHOT_AT = 60, 5


def gpt2_small_shapes() -> list[tuple[int, ...]]:
    width, layers = 768, 12
    per_layer = [(width,), (width,), (width, 3 * width), (3 * width,), (width, width), (width,)]
    per_layer += [(width,), (width,), (width, 4 * width), (4 * width,), (4 * width, width)]
    per_layer += [(width,)]
    return [(50304, width), (1024, width), *per_layer * layers, (width,), (width,)]


def main() -> None:
    parser = argparse.ArgumentParser()
    ways = ["none", "asarray", "async", "pinned", "asarray-read", "async-read", "write"]
    parser.add_argument("--ways", nargs="*", default=ways)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--matmuls", type=int, default=26)
    parser.add_argument("--size", type=int, default=8192, help="of the square matrices")
    args = parser.parse_args()
    device = jax.devices()[0]
    key = jax.random.key(0)
    params = [jax.random.normal(key, s, jnp.float32) for s in gpt2_small_shapes()]
    m = jax.random.normal(key, (args.size, args.size), jnp.bfloat16) * 0.01
    w = jax.random.normal(key, (args.size, args.size), jnp.bfloat16) * 0.01
    host_params = [np.array(a) for a in params]

    @jax.jit
    def call(m: jax.Array, w: jax.Array) -> jax.Array:
        def body(_: int, m: jax.Array) -> jax.Array:
            return jnp.tanh(m @ w)

        return jax.lax.fori_loop(0, args.matmuls, body, m)

    metadata = {"tokenizer": "x" * 1_000_000, "step": 1}  # about a BPE tokenizer's JSON
    pinned = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    directory = Path(tempfile.mkdtemp())

    def one(way: str) -> dict[str, object]:
        nonlocal m
        gaps: list[float] = []
        stop = threading.Event()

        def tick() -> None:
            last = time.perf_counter()
            while not stop.is_set():
                time.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = threading.Thread(target=tick)
        ticker.start()
        worker: threading.Thread | None = None
        thread_s = [0.0]
        calls = []
        started = time.perf_counter()
        for i in range(CALLS):
            t = time.perf_counter()
            m = call(m, w)
            float(np.asarray(m[0, 0]))
            calls.append(time.perf_counter() - t)
            if i == SNAPSHOT_AT and way != "none":
                snap = [a.copy() for a in params]
                if way.startswith("async"):
                    for a in snap:
                        a.copy_to_host_async()
                if way.startswith("pinned"):
                    snap = jax.device_put(snap, pinned)
                host_ready = host_params if way == "write" else None

                def job(snap: list = snap, host_ready: list | None = host_ready) -> None:
                    t0 = time.perf_counter()
                    host = host_ready or [np.asarray(a) for a in snap]
                    if not way.endswith("-read"):
                        tensors = {f"p{j}": a for j, a in enumerate(host)}
                        save(directory / "checkpoint.safetensors", tensors, metadata)
                    thread_s[0] = time.perf_counter() - t0

                worker = threading.Thread(target=job)
                worker.start()
        loop_s = time.perf_counter() - started
        if worker is not None:
            worker.join()
        stop.set()
        ticker.join()
        return {
            "way": way,
            "loop_s": round(loop_s, 4),
            "median_call_ms": round(1000 * float(np.median(calls)), 2),
            "slowest_calls_ms": sorted(round(1000 * c, 1) for c in calls)[-4:],
            "thread_s": round(thread_s[0], 3),
            "longest_gap_ms": round(1000 * max(gaps), 1),
        }

    one("none")  # compile and warm up
    rows = []
    for _ in range(2):
        for way in args.ways:
            row = one(way)
            rows.append(row)
    base = float(np.mean([r["loop_s"] for r in rows if r["way"] == "none"]))
    for row in rows:
        row["extra_ms"] = round(1000 * (row["loop_s"] - base), 1)
        print(json.dumps(row), flush=True)
        if args.out:
            with args.out.open("a") as file:
                file.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
