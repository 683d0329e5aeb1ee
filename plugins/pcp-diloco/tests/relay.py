"""A relay on the path between workers and a shepherd, without the shared secret.

    python relay.py LISTEN_PORT SHEPHERD_PORT MODE

It forwards every capnp-tcp frame both ways, reading each whole, and, by MODE:

- `pass`: changes nothing (so a run through it shows the relay itself works);
- `swap-program`: replaces the program in the shepherd's Setup with its own bytes and
  their sha256, as an attacker who wants its code run on the workers would;
- `inject`: sends the worker a forged Stop of its own right after the Setup;
- `replay`: sends the shepherd the worker's first Result (and its seal) a second time.

It prints one line per frame it changed, so a test can tell it acted.
"""

import contextlib
import hashlib
import socket
import sys
import threading

import numpy as np
from pcp_capnp_tcp import header
from pcp_capnp_tcp.connection import MAGIC, PREFIX

from pcp_core.wire.messages import Result, Setup, Stop
from pcp_core.wire.transport import TensorHeader

ATTACKER_PROGRAM = b"\x7fELF not your program " * 512


def read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return bytes(data)


def read_frame(sock: socket.socket) -> tuple[bytes, bytes, bytes]:
    prefix = read_exactly(sock, PREFIX.size)
    _, header_bytes, payload = PREFIX.unpack(prefix)
    return prefix, read_exactly(sock, header_bytes), read_exactly(sock, payload)


def frame(message: object, tensors: list[tuple[str, np.ndarray]]) -> bytes:
    headers = [TensorHeader(n, a.dtype.name, a.shape, a.nbytes) for n, a in tensors]
    encoded = header.encode(message, headers)
    payload = b"".join(a.tobytes() for _, a in tensors)
    return PREFIX.pack(MAGIC, len(encoded), len(payload)) + encoded + payload


def swap_program(head: bytes, payload: bytes) -> bytes:
    """The Setup frame with the attacker's program in place of the shepherd's."""
    setup, tensors = header.decode(head, len(payload))
    arrays, offset = [], 0
    for tensor in tensors:
        dtype = header.wire_dtype(tensor.dtype)
        array = np.frombuffer(payload, dtype, int(np.prod(tensor.shape)), offset)
        arrays.append((tensor.name, array.reshape(tensor.shape)))
        offset += tensor.nbytes
    program = np.frombuffer(ATTACKER_PROGRAM, np.uint8)
    arrays = [(n, program if n == "artifact" else a) for n, a in arrays]
    digest = hashlib.sha256(ATTACKER_PROGRAM).hexdigest()
    forged = Setup(setup.artifact_kind, digest, setup.settings_json)
    return frame(forged, arrays)


def pump(source: socket.socket, target: socket.socket, mode: str, to_worker: bool) -> None:
    first_result: list[bytes] = []
    try:
        while True:
            prefix, head, payload = read_frame(source)
            message, _ = header.decode(head, len(payload))
            data = prefix + head + payload
            if to_worker and mode == "swap-program" and isinstance(message, Setup):
                data = swap_program(head, payload)
                print("relay: swapped the program in the Setup", flush=True)
            target.sendall(data)
            if to_worker and mode == "inject" and isinstance(message, Setup):
                seal = read_frame(source)
                target.sendall(b"".join(seal))
                target.sendall(frame(Stop("forged by the relay"), []))
                print("relay: injected a Stop", flush=True)
            if not to_worker and mode == "replay" and isinstance(message, Result):
                seal = b"".join(read_frame(source))
                target.sendall(seal)
                if not first_result:
                    first_result.append(data + seal)
                    target.sendall(first_result[0])
                    print("relay: replayed the first Result", flush=True)
    except (ConnectionError, OSError):
        pass
    finally:
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def main() -> None:
    listen_port, shepherd_port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    server = socket.create_server(("127.0.0.1", listen_port))
    print(f"relay listening on {listen_port}, mode {mode}", flush=True)
    while True:
        worker, _ = server.accept()
        shepherd = socket.create_connection(("127.0.0.1", shepherd_port))
        for args in ((shepherd, worker, mode, True), (worker, shepherd, mode, False)):
            threading.Thread(target=pump, args=args, daemon=True).start()


if __name__ == "__main__":
    main()
