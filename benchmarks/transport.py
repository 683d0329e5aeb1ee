"""The capnp-tcp transport against a raw socket on loopback, for the same parameter sets.

Each run moves one set of float32 tensors shaped like a GPT's parameters from a
sending thread to a receiving one over 127.0.0.1: once as a PCP frame through
`capnp-tcp`, once as the same bytes through plain `socket.sendall`, read with
`recv_into`. Both receivers read into preallocated arrays (capnp-tcp through a
TensorSink, as the shepherd does); capnp-tcp into fresh arrays (a plain `receive()`)
is shown too. The methods take turns, in alternating order; figures are from the best
of the repetitions, with the ratio of the medians beside it. Writes
benchmarks/results/transport.json and .md.

    python benchmarks/transport.py            # 100 MiB and 1 GiB
    python benchmarks/transport.py --quick    # 8 MiB and 64 MiB
"""

import argparse
import json
import logging
import os
import platform
import socket
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import structlog
from pcp_capnp_tcp import connect, listen

from pcp_core.wire.messages import Assignment, Tensor
from pcp_core.wire.transport import Connection, TensorHeader, TransportOptions

RESULTS = Path(__file__).parent / "results"
MiB = 2**20

# name: (total bytes, layers, width, repetitions); the vocabulary fills up the total
SIZES = {
    "100 MiB": (100 * MiB, 6, 512, 30),
    "1 GiB": (1024 * MiB, 12, 1280, 8),
}
QUICK_SIZES = {
    "8 MiB": (8 * MiB, 2, 256, 10),
    "64 MiB": (64 * MiB, 4, 512, 10),
}


def gpt_like(total_bytes: int, n_layer: int, n_embd: int) -> list[Tensor]:
    """Float32 tensors shaped like a GPT-2 model's, the vocabulary sized to reach the total."""
    d = n_embd
    block = [("ln_1", (d,)), ("attn.qkv", (d, 3 * d)), ("attn.proj", (d, d))]
    block += [("ln_2", (d,)), ("mlp.fc", (d, 4 * d)), ("mlp.proj", (4 * d, d))]
    shapes = [("wpe", (1024, d))]
    shapes += [(f"h{i}.{name}", shape) for i in range(n_layer) for name, shape in block]
    shapes.append(("ln_f", (d,)))
    used = sum(int(np.prod(shape)) for _, shape in shapes)
    vocab = (total_bytes // 4 - used) // d
    rng = np.random.default_rng(0)
    return [
        Tensor(name, rng.standard_normal(shape, dtype=np.float32))
        for name, shape in [("wte", (vocab, d)), *shapes]
    ]


class Preallocated:
    """A TensorSink that hands out the same arrays every time."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays

    def buffer(self, index: int, header: TensorHeader) -> np.ndarray:
        return self.arrays[index]

    def filled(self, index: int, header: TensorHeader, array: np.ndarray) -> None:
        pass


def timed(send: Callable[[], None], receive: Callable[[], None]) -> float:
    """Seconds from the start of sending until everything was received."""
    sender = threading.Thread(target=send)
    start = time.perf_counter()
    sender.start()
    receive()
    elapsed = time.perf_counter() - start
    sender.join()
    return elapsed


def raw_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    for sock in (client, accepted):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, accepted


def raw_send(sock: socket.socket, arrays: list[np.ndarray]) -> None:
    for array in arrays:
        sock.sendall(memoryview(array).cast("B"))


def raw_receive(sock: socket.socket, arrays: list[np.ndarray]) -> None:
    for array in arrays:
        view = memoryview(array).cast("B")
        done = 0
        while done < len(view):
            done += sock.recv_into(view[done:])


def capnp_pair() -> tuple[Connection, Connection]:
    listener = listen("127.0.0.1", 0, TransportOptions())
    client = connect(*listener.address, TransportOptions())
    server = listener.accept(10)
    listener.close()
    return client, server


def measure(label: str, total: int, n_layer: int, n_embd: int, repetitions: int) -> dict:
    tensors = gpt_like(total, n_layer, n_embd)
    arrays = [tensor.array for tensor in tensors]
    nbytes = sum(array.nbytes for array in arrays)
    message = Assignment(1, 100, 0, 1, 0, tensors)
    sink = Preallocated([np.zeros_like(array) for array in arrays])
    raw_out, raw_in = raw_pair()
    capnp_out, capnp_in = capnp_pair()
    methods = {
        "raw": lambda: timed(
            lambda: raw_send(raw_out, arrays), lambda: raw_receive(raw_in, sink.arrays)
        ),
        "capnp": lambda: timed(lambda: capnp_out.send(message), lambda: capnp_in.receive(sink)),
        "capnp_fresh": lambda: timed(lambda: capnp_out.send(message), capnp_in.receive),
    }
    for run in methods.values():  # warm-up: faults in the buffers, grows the socket windows
        run()
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    for repetition in range(repetitions):
        order = list(methods) if repetition % 2 == 0 else list(reversed(methods))
        for name in order:
            seconds[name].append(methods[name]())
    for closable in (raw_out, raw_in, capnp_out, capnp_in):
        closable.close()
    best = {name: min(times) for name, times in seconds.items()}
    median = {name: statistics.median(times) for name, times in seconds.items()}
    row = {
        "size": label,
        "bytes": nbytes,
        "tensors": len(tensors),
        "largest_tensor_bytes": max(array.nbytes for array in arrays),
        "repetitions": repetitions,
        **{f"{name}_gb_s": round(nbytes / 1e9 / best[name], 3) for name in methods},
        **{f"{name}_median_gb_s": round(nbytes / 1e9 / median[name], 3) for name in methods},
        "capnp_over_raw": round(best["raw"] / best["capnp"], 3),
        "capnp_over_raw_median": round(median["raw"] / median["capnp"], 3),
    }
    print(row, flush=True)
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| size | tensors | raw GB/s | capnp-tcp GB/s | capnp/raw | capnp/raw (medians) "
        "| capnp-tcp, fresh arrays GB/s |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['size']} ({r['bytes']:,} B) | {r['tensors']} | {r['raw_gb_s']} | "
        f"{r['capnp_gb_s']} | {r['capnp_over_raw']} | {r['capnp_over_raw_median']} | "
        f"{r['capnp_fresh_gb_s']} |"
        for r in rows
    ]
    note = (
        "\nLoopback, sender and receiver threads in one process; GB/s from the best of "
        "the repetitions (the medians' ratio beside it). raw and capnp-tcp read into "
        "preallocated arrays; the last column allocates new ones for every message "
        "(`receive()` without a sink).\n"
    )
    return "\n".join(lines) + "\n" + note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 MiB and 64 MiB only")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    sizes = QUICK_SIZES if args.quick else SIZES
    rows = [measure(label, *size) for label, size in sizes.items()]
    machine = {
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }
    RESULTS.mkdir(exist_ok=True)
    result = {"machine": machine, "quick": args.quick, "rows": rows}
    (RESULTS / "transport.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "transport.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
