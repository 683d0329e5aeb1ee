"""A real worker that misbehaves in one way from round 1 on: `python bad_worker.py MODE
HOST:PORT STATE_DIR` (the secret comes from $PCP_TOKEN). Round 0 it plays fair, so the
shepherd has honest norms to judge later ones by.

Modes: nan (NaN in its pseudo-gradient), norm (1000x too large), missing (one tensor
left out), shape (a tensor of the wrong shape), stale (replays its round-0 result),
partial (dies halfway through sending its pseudo-gradient), twin (honest, but under
the name "twin": start two), huge (every value 1e30, finite, announcing its round-0
norm), huge-first (every value 1e30 from round 0 on, announcing its true norm), no-losses
(a result without losses).
"""

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pcp_core import plugins
from pcp_core.wire import auth
from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import Delta, Message, Result, Tensor
from pcp_core.wire.transport import TensorHeader, TransportOptions
from pcp_core.worker import loop as worker
from pcp_core.worker.session import RoundWork

MODE, CONNECT, STATE_DIR = sys.argv[1:4]
honest_round = plugins.host().algorithm("diloco").worker_round


def bad_round(session: Any, assignment: Any) -> RoundWork:
    work = honest_round(session, assignment)
    if MODE == "huge-first":
        for tensor in work.tensors:
            tensor.array[...] = 1e30
    if assignment.round == 0:
        return work
    first = work.tensors[0]
    if MODE == "nan":
        first.array[...] = np.nan
    elif MODE == "norm":
        for tensor in work.tensors:
            tensor.array *= 1000
    elif MODE == "missing":
        work.tensors = work.tensors[:-1]
    elif MODE == "shape":
        work.tensors[0] = Tensor(first.name, np.ascontiguousarray(first.array[:1]))
    elif MODE == "huge":
        for tensor in work.tensors:
            tensor.array[...] = 1e30
    elif MODE == "no-losses":
        work.losses = []
    return work


class Host:
    """The installed plugins, but the diloco worker round is `bad_round`."""

    def __init__(self) -> None:
        self.host = plugins.host()

    def algorithm(self, name: str) -> Any:
        return dataclasses.replace(self.host.algorithm(name), worker_round=bad_round)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.host, name)


first_result: list[Result] = []
honest_send = LiveConnection.send


def bad_send(self: LiveConnection, message: Message) -> int:
    if isinstance(message, Result):
        if not first_result:
            first_result.append(message)
        if MODE == "stale" and message.round >= 1:
            return honest_send(self, first_result[0])
        if MODE == "huge" and message.round >= 1:  # an ordinary-looking norm
            message = dataclasses.replace(message, norm=first_result[0].norm)
    if isinstance(message, Delta) and MODE == "partial" and message.round >= 1:
        send_half_and_die(self, message)
    return honest_send(self, message)


def send_half_and_die(live: LiveConnection, delta: Delta) -> None:
    from pcp_capnp_tcp import header
    from pcp_capnp_tcp.connection import MAGIC, PREFIX

    arrays = [t.array for t in delta.tensors]
    headers = [
        TensorHeader(t.name, t.array.dtype.name, t.array.shape, t.array.nbytes)
        for t in delta.tensors
    ]
    encoded = header.encode(delta, headers)
    payload = b"".join(a.tobytes() for a in arrays)
    frame = PREFIX.pack(MAGIC, len(encoded), len(payload)) + encoded
    live.conn._sock.sendall(frame + payload[: len(payload) // 2])  # type: ignore[attr-defined]
    os._exit(9)


LiveConnection.send = bad_send  # type: ignore[method-assign]
host, _, port = CONNECT.rpartition(":")
options = worker.WorkerOptions(
    host=host,
    port=int(port),
    backend="cpu",
    target=None,
    device=None,
    secret=auth.load_secret(None),
    transport="capnp-tcp",
    transport_options=TransportOptions(timeout_s=30),
    state_dir=Path(STATE_DIR),
    name="twin" if MODE == "twin" else f"bad-{MODE}",
)
worker.run_worker(options, Host())
