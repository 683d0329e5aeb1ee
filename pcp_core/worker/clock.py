"""Where a worker's time goes between two of its Results: its inner steps (the
algorithm measures those), waiting for the shepherd, and sending.

Waiting is the time blocked receiving: for the shepherd's decision on the last Result,
for the next Assignment, and while its parameters arrive. Sending is the time blocked
handing a Result or a Delta to the transport. Both go to the shepherd with the next
Result (`pcp_core.wire.messages.Result.waited_s`, `sent_s`), which turns them into the
run's compute utilisation.
"""

import time
from dataclasses import dataclass
from typing import Any

from pcp_core.wire.messages import Message


@dataclass
class NetworkClock:
    """Seconds blocked on the connection since the last `take`."""

    waited_s: float = 0.0
    sent_s: float = 0.0

    def receive(self, conn: Any) -> Message:
        started = time.perf_counter()
        try:
            return conn.receive()
        finally:
            self.waited_s += time.perf_counter() - started

    def send(self, conn: Any, message: Message) -> None:
        started = time.perf_counter()
        try:
            conn.send(message)
        finally:
            self.sent_s += time.perf_counter() - started

    def take(self) -> tuple[float, float]:
        """The waiting and sending seconds so far, and start counting again."""
        taken = (self.waited_s, self.sent_s)
        self.waited_s = self.sent_s = 0.0
        return taken
