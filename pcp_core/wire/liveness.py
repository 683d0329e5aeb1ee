"""Liveness in both directions: heartbeats out, a read deadline in.

Each side wraps its connection in a `LiveConnection`, which sends a `Heartbeat` every
`interval_s` from a background thread whenever nothing else went out in that time, and
whose `receive` skips the peer's heartbeats. The transport's per-operation timeout
(`TransportOptions.timeout_s`) is the read deadline: a peer that sends nothing at all for
that long (suspended, cut off, its machine gone) fails the read with a TransportError,
while a peer busy computing for an hour stays alive through its heartbeats.

The interval is a quarter of the shepherd's `--worker-timeout` (so three heartbeats can
go missing before a peer is declared dead), sent to the worker in the Welcome.
"""

import threading
import time

import structlog

from pcp_core.wire.messages import Heartbeat, Message
from pcp_core.wire.transport import Connection, TensorSink, TransportError

log = structlog.get_logger(__name__)

HEARTBEATS_PER_TIMEOUT = 4


def heartbeat_interval(timeout_s: float) -> float:
    return timeout_s / HEARTBEATS_PER_TIMEOUT


class LiveConnection:
    """A `Connection` that keeps itself alive; see the module docstring."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.peer = conn.peer
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_heard = time.time()  # when the peer last said anything, heartbeats too

    @property
    def bytes_sent(self) -> int:
        return self.conn.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.conn.bytes_received

    def start_heartbeats(self, interval_s: float) -> None:
        self._thread = threading.Thread(
            target=self._beat, args=(interval_s,), name=f"pcp-heartbeat {self.peer}", daemon=True
        )
        self._thread.start()

    def _beat(self, interval_s: float) -> None:
        last_sent = -1
        while not self._stopped.wait(interval_s):
            if self.conn.bytes_sent != last_sent:  # something went out meanwhile: enough
                last_sent = self.conn.bytes_sent
                continue
            try:
                self.conn.send(Heartbeat())
            except (TransportError, OSError):
                return  # the connection is gone; the reading side finds out and says so
            last_sent = self.conn.bytes_sent

    def send(self, message: Message) -> int:
        return self.conn.send(message)

    def receive(
        self, sink: TensorSink | None = None, max_frame_bytes: int | None = None
    ) -> Message:
        """The next message that is not a heartbeat."""
        while True:
            message = self.conn.receive(sink, max_frame_bytes)
            self.last_heard = time.time()
            if not isinstance(message, Heartbeat):
                return message

    def close(self) -> None:
        self._stopped.set()
        self.conn.close()
