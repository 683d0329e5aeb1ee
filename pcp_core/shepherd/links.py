"""An admitted worker as the shepherd holds it: its index, its connection (sealed, with
heartbeats) and what its Hello said; admission makes one, the rounds use it."""

from dataclasses import dataclass

from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import Hello


@dataclass
class WorkerLink:
    index: int
    conn: LiveConnection
    hello: Hello

    @property
    def label(self) -> str:
        hello = self.hello
        several = f" on devices {hello.device}" if "," in hello.device else ""
        return f"worker {self.index} ({hello.worker_name}, {hello.backend}/{hello.arch}{several})"
