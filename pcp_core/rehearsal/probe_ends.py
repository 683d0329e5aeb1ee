"""The ends of a link measurement (`pcp_core.rehearsal.probe`), each run as a small
child process inside a node's namespace (`python -m pcp_core.rehearsal.probe <role>
...`): a TCP sink and sender for goodput, an echo server and pinger for round trips, and
a UDP sink and sender for loss. Each returns what it saw, which the probe prints as JSON.
"""

from __future__ import annotations

import socket
import time
from typing import Any

SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # Linux; Python names it from 3.12


def _listen(port: int, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket bound to every address on `port`; says "listening" on stdout."""
    sock = socket.socket(socket.AF_INET, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", port))
    if kind == socket.SOCK_STREAM:
        sock.listen(1)
    print("listening", flush=True)
    return sock


def tcp_sink(port: int, warmup: float) -> dict[str, Any]:
    """Receive one connection until EOF; goodput over the part after `warmup` seconds."""
    with _listen(port) as server:
        conn, _ = server.accept()
        with conn:
            total = 0
            first = mark = None
            mark_bytes = 0
            while True:
                data = conn.recv(1 << 20)
                now = time.monotonic()
                if not data:
                    break
                if first is None:
                    first = now
                total += len(data)
                if mark is None and now - first >= warmup:
                    mark, mark_bytes = now, total
                last = now
    if first is None or mark is None or last <= mark:
        return {"bytes": total, "mbit": 0.0, "seconds": 0.0}
    seconds = last - mark
    return {"bytes": total, "seconds": seconds, "mbit": (total - mark_bytes) * 8 / seconds / 1e6}


def tcp_send(host: str, port: int, seconds: float) -> dict[str, Any]:
    """Send zeros to host:port for `seconds`, then close."""
    chunk = bytes(1 << 16)
    sent = 0
    with socket.create_connection((host, port), timeout=30) as sock:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sock.sendall(chunk)
            sent += len(chunk)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # wait until the sink has read everything and closed
    return {"sent": sent}


def tcp_echo(port: int) -> dict[str, Any]:
    """Echo one connection's bytes back until EOF."""
    with _listen(port) as server:
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(4096):
                conn.sendall(data)
    return {}


def tcp_ping(host: str, port: int, count: int, interval: float) -> dict[str, Any]:
    """Time `count` one-byte request/response exchanges; the first includes the handshake."""
    rtts: list[float] = []
    start = time.monotonic()
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        first = True
        for _ in range(count + 1):
            sent = time.monotonic()
            sock.sendall(b"x")
            if not sock.recv(1):
                break
            if first:
                connect_ms = (time.monotonic() - start) * 1000
                first = False
            else:
                rtts.append((time.monotonic() - sent) * 1000)
            time.sleep(interval)
    return {"rtt_ms": rtts, "first_exchange_ms": connect_ms}


# Room in the sink's socket for every datagram of a probe (each takes about 1 KiB of
# buffer), so a sink starved of CPU on a busy machine loses none to a full socket: what
# it misses is then the link's loss alone.
UDP_SINK_BUFFER = 8 << 20


def udp_sink(port: int, idle: float) -> dict[str, Any]:
    """Count datagrams until none has come for `idle` seconds (after the first)."""
    with _listen(port, socket.SOCK_DGRAM) as sock:
        try:  # root may exceed net.core.rmem_max; others get what it allows
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, UDP_SINK_BUFFER)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_SINK_BUFFER)
        sock.settimeout(30)
        received = 0
        try:
            while True:
                sock.recv(2048)
                received += 1
                sock.settimeout(idle)
        except TimeoutError:
            pass
    return {"received": received}


def udp_send(host: str, port: int, count: int, rate: float) -> dict[str, Any]:
    """Send `count` 100-byte datagrams, at most `rate` per second.

    Paced from each send, never catching up: a sender paused by a busy machine resumes
    at `rate` instead of bursting past the receiving queues.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _ in range(count):
            sent = time.monotonic()
            sock.sendto(b"p" * 100, (host, port))
            delay = sent + 1 / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    return {"sent": count}
