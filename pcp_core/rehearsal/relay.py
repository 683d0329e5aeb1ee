"""The delaying relay: one-way delay and jitter for TCP, since this kernel has no netem.

It runs in the router namespace (pcp_core/rehearsal/links.py starts it). An nftables
rule there redirects every TCP connection the router would forward to this relay,
which reads the original destination (SO_ORIGINAL_DST), connects to it, and copies
the bytes both ways, holding each chunk until `read time + delay` where the delay of
a direction is the one-way delay of the sender's link plus the receiver's, each with
its jitter drawn uniformly in ±jitter_ms. What that does and does not emulate:

- does: the round-trip time an application sees (request → response), including one
  extra round trip before the first byte of a connection (the TCP handshake); a
  bounded amount of data in flight per direction, about the path's bandwidth-delay
  product, so a slow, far path does not turn into an unbounded buffer.
- does not: per-packet delay (the kernel legs client↔relay and relay↔server have a
  near-zero round-trip time, so TCP's slow start, congestion window and loss recovery
  run as on a LAN: random loss costs far less throughput than on a real far link);
  reordering (bytes of a stream stay in order, jitter only stretches or squeezes the
  gaps between chunks); UDP and ICMP (forwarded without delay); the peer address (the
  server sees the router's address on its own link, not the client's).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import socket
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger(__name__)

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
CHUNK = 256 * 1024
MIN_BUFFER = 256 * 1024  # bytes a direction may hold beyond the bandwidth-delay product
QUEUE_SECONDS = 0.05  # the relay's send buffer: 50 ms at the outgoing link's rate


@dataclass(frozen=True)
class Direction:
    """The emulated path one way: its fixed delay, jitter and bottleneck rate."""

    delay_s: float
    jitter_s: float
    rate_bytes: float

    @property
    def buffer_bytes(self) -> int:
        """Bytes held in flight at most: the path's bandwidth-delay product plus slack."""
        return int(self.rate_bytes * (self.delay_s + self.jitter_s) * 1.25) + MIN_BUFFER

    def sample(self) -> float:
        """One delay draw, jitter uniform in ±jitter, never negative."""
        if self.jitter_s <= 0:
            return self.delay_s
        return max(0.0, self.delay_s + random.uniform(-self.jitter_s, self.jitter_s))


def direction(source: dict[str, Any], target: dict[str, Any]) -> Direction:
    """The path from one node's link to another's: delays add, the slower rate bounds."""
    return Direction(
        delay_s=(source["delay_ms"] + target["delay_ms"]) / 1000,
        jitter_s=(source["jitter_ms"] + target["jitter_ms"]) / 1000,
        rate_bytes=min(source["rate_mbit"], target["rate_mbit"]) * 1e6 / 8,
    )


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """The address a redirected connection was meant for."""
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port


async def pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    path: Direction,
    not_before: float,
) -> None:
    """Copy one direction, releasing each chunk at read time + one delay draw.

    Releases never go backwards (a stream cannot reorder) and nothing leaves before
    `not_before` + delay (the connection's handshake). Reading stops while the held
    bytes exceed the path's bandwidth-delay product.
    """
    loop = asyncio.get_running_loop()
    held: collections.deque[tuple[float, bytes]] = collections.deque()
    held_bytes = 0
    ready = asyncio.Event()
    room = asyncio.Event()
    room.set()
    last_release = 0.0

    async def read_side() -> None:
        nonlocal held_bytes, last_release
        while True:
            await room.wait()
            data = await reader.read(CHUNK)
            now = loop.time()
            release = max(last_release, max(now, not_before) + path.sample())
            last_release = release
            held.append((release, data))
            held_bytes += len(data)
            if held_bytes >= path.buffer_bytes:
                room.clear()
            ready.set()
            if not data:
                return

    async def write_side() -> None:
        nonlocal held_bytes
        while True:
            while not held:
                ready.clear()
                await ready.wait()
            release, data = held.popleft()
            wait = release - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
            held_bytes -= len(data)
            if held_bytes < path.buffer_bytes:
                room.set()

    reading = asyncio.create_task(read_side())
    try:
        await write_side()
    finally:
        reading.cancel()


class Relay:
    """Accepts redirected connections and pipes them with their path's delays."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.port: int = spec["port"]
        self.links: dict[str, dict[str, Any]] = spec["links"]
        self.connections = 0

    def _send_buffer(self, writer: asyncio.StreamWriter, link: dict[str, Any]) -> None:
        """Cap the kernel's send buffer at 50 ms of the outgoing link: a router queue."""
        sock = writer.get_extra_info("socket")
        size = max(65536, int(link["rate_mbit"] * 1e6 / 8 * QUEUE_SECONDS))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        """Pipe one redirected connection to where it was going, both ways."""
        accepted = asyncio.get_running_loop().time()
        client_sock = client_w.get_extra_info("socket")
        source = client_w.get_extra_info("peername")[0]
        target, port = original_destination(client_sock)
        source_link = self.links.get(source)
        target_link = self.links.get(target)
        if source_link is None or target_link is None:
            log.warning("relay_unknown_peer", source=source, target=target)
            client_w.close()
            return
        up = direction(source_link, target_link)
        down = direction(target_link, source_link)
        try:
            server_r, server_w = await asyncio.open_connection(target, port)
        except OSError as error:
            log.info("relay_connect_failed", target=f"{target}:{port}", error=str(error))
            client_w.transport.abort()
            return
        self.connections += 1
        self._send_buffer(server_w, target_link)
        self._send_buffer(client_w, source_link)
        rtt = up.delay_s + down.delay_s
        # The client's first byte leaves after the handshake's round trip.
        tasks = [
            asyncio.create_task(pipe(client_r, server_w, up, accepted + rtt)),
            asyncio.create_task(pipe(server_r, client_w, down, accepted + rtt)),
        ]
        try:
            await asyncio.gather(*tasks)
        except (ConnectionError, OSError):
            pass
        finally:
            for task in tasks:
                task.cancel()
            for writer in (client_w, server_w):
                writer.transport.abort()

    async def serve(self) -> None:
        """Listen on all addresses of the router namespace until cancelled."""
        server = await asyncio.start_server(self.handle, "0.0.0.0", self.port, backlog=512)
        print("ready", flush=True)
        log.info("relay_listening", port=self.port, links=len(self.links))
        async with server:
            await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    """Run the relay with the JSON spec given as the only argument."""
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(args[0])
    # stdout carries only the "ready" line the parent waits for; logs go to stderr.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    random.seed(time.time_ns())
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(Relay(spec).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
