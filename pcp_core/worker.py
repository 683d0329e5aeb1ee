"""The worker: join a shepherd, load the program it ships, train when asked.

The algorithm (named in the shepherd's Setup) decides what a round is; this module
handles the join handshake, the program and data, and the message loop. The
inner optimizer state lives on the device across rounds.
"""

import hashlib
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from pcp_core import auth
from pcp_core.compiler import iree_runtime_version
from pcp_core.data import CharCorpus
from pcp_core.executor import IreeExecutor, open_device
from pcp_core.messages import (
    Assignment,
    Challenge,
    Failure,
    Hello,
    Proof,
    Reject,
    Result,
    Setup,
    Stop,
    Welcome,
)
from pcp_core.program import TensorSpec
from pcp_core.transport import Connection, TransportOptions

log = structlog.get_logger(__name__)


class JoinRefused(RuntimeError):
    """The shepherd refused this worker, or failed to prove it knows the secret."""


@dataclass
class WorkerOptions:
    host: str
    port: int
    backend: str
    target: str | None
    device: int | None
    secret: bytes | None
    transport: str
    transport_options: TransportOptions
    name: str = ""


@dataclass
class WorkerSession:
    """What an algorithm's worker side works with during a round."""

    index: int
    executor: IreeExecutor
    corpus: CharCorpus  # the training tokens the shepherd shipped
    settings: dict[str, Any]

    def batches(self, assignment: Assignment, call: int) -> tuple[np.ndarray, np.ndarray]:
        """Deterministic batches from this worker's shard for this round."""
        return self.corpus.batches(
            "train",
            self.settings["steps_per_call"],
            self.settings["batch_size"],
            self.settings["block_size"],
            stream=(assignment.seed, assignment.round, self.index, call),
            shard=(assignment.shard_index, assignment.shard_count),
        )


WorkerRound = Callable[[WorkerSession, Assignment], Result]


def join(conn: Connection, hello: Hello, secret: bytes | None) -> int:
    """The handshake; returns the worker index the shepherd gave this worker."""
    conn.send(hello)
    challenge = conn.receive()
    if isinstance(challenge, Reject):
        raise JoinRefused(challenge.reason)
    if not isinstance(challenge, Challenge):
        raise JoinRefused(f"expected a challenge, got {type(challenge).__name__}")
    if secret is None:
        raise JoinRefused("the shepherd requires a shared secret: use --token-file or PCP_TOKEN")
    own_nonce = auth.nonce()
    conn.send(Proof(auth.worker_proof(secret, challenge.nonce, own_nonce), own_nonce))
    answer = conn.receive()
    if isinstance(answer, Reject):
        raise JoinRefused(answer.reason)
    if not isinstance(answer, Welcome):
        raise JoinRefused(f"expected a welcome, got {type(answer).__name__}")
    if not auth.matches(auth.shepherd_proof(secret, challenge.nonce, own_nonce), answer.mac):
        raise JoinRefused("the shepherd did not prove it knows the shared secret")
    return answer.worker_index


def load_setup(
    setup: Setup, options: WorkerOptions, runtime_flags: tuple[str, ...]
) -> tuple[IreeExecutor, CharCorpus, dict]:
    """Check the shipped program's hash, load it on the device, set the inner state."""
    tensors = {t.name: t.array for t in setup.tensors}
    vmfb = tensors.pop("vmfb").tobytes()
    digest = hashlib.sha256(vmfb).hexdigest()
    if digest != setup.vmfb_sha256:
        raise JoinRefused(
            f"program hash mismatch: got {digest[:16]}…, "
            f"announced {setup.vmfb_sha256[:16]}…; refusing to load it"
        )
    settings = json.loads(setup.settings_json)
    param_specs = [TensorSpec(n, tuple(s), d) for n, s, d in settings["param_specs"]]
    opt_specs = [TensorSpec(n, tuple(s), d) for n, s, d in settings["opt_specs"]]
    backend_driver = settings["driver"]
    executor = IreeExecutor(
        vmfb, backend_driver, param_specs, opt_specs, options.device, runtime_flags
    )
    executor.set_opt_state([tensors[s.name] for s in opt_specs])
    tokens = tensors["tokens"].astype(np.int32)
    corpus = CharCorpus(settings["vocabulary"], tokens, tokens[:0], "shepherd")
    return executor, corpus, settings


def run_worker(options: WorkerOptions, plugins: Any) -> None:
    """Join, then serve rounds until the shepherd says stop."""
    backend = plugins.backend(options.backend)
    arch = backend.resolve_arch(options.target)
    open_device(  # fail early
        backend.driver, options.device, backend.install_hint, backend.runtime_flags
    )
    transport = plugins.transport(options.transport)
    name = options.name or f"{socket.gethostname()}:{os.getpid()}"
    hello = Hello(name, backend.name, arch, iree_runtime_version(), str(options.device or 0))
    conn = transport.connect(options.host, options.port, options.transport_options)
    try:
        index = join(conn, hello, options.secret)
        log.info("joined", shepherd=f"{options.host}:{options.port}", index=index, arch=arch)
        setup = conn.receive()
        if isinstance(setup, Reject):
            raise JoinRefused(setup.reason)
        if not isinstance(setup, Setup):
            raise JoinRefused(f"expected the program, got {type(setup).__name__}")
        try:
            executor, corpus, settings = load_setup(setup, options, backend.runtime_flags)
        except JoinRefused as error:
            conn.send(Failure(str(error)))
            raise
        session = WorkerSession(index, executor, corpus, settings)
        worker_round: WorkerRound = plugins.algorithm(settings["algorithm"]).worker_round
        while True:
            message = conn.receive()
            if isinstance(message, Stop):
                log.info("stopping", reason=message.reason)
                return
            if not isinstance(message, Assignment):
                raise JoinRefused(f"unexpected {type(message).__name__} from the shepherd")
            conn.send(worker_round(session, message))
    finally:
        conn.close()
