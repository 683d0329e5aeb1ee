"""The worker: join a shepherd, load the program it ships, train when asked.

The algorithm (named in the shepherd's Setup) decides what a round is; this module
handles the join handshake, the program and data, heartbeats, the message loop, and the
inner optimizer state: it lives on the device across rounds and is saved after each
(`pcp_core.worker.state`), so a restarted worker, or a round the shepherd asks for again,
starts from the state that round started from.

Losing the shepherd (silent past the timeout, or gone) ends the process with the
"crashed" exit code; its supervisor starts it again, and it rejoins.
"""

import hashlib
import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from pcp_core.backends import Backend, Executor
from pcp_core.data.errors import DataError
from pcp_core.data.shard_transfer import ShardSource, default_shard_cache, shard_dataset
from pcp_core.data.text import CharCorpus
from pcp_core.program.build import TensorSpec
from pcp_core.shepherd.aggregation import delta_norm
from pcp_core.wire import auth
from pcp_core.wire.channel import SealedConnection, session_keys
from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import (
    Assignment,
    Challenge,
    Delta,
    Discard,
    Failure,
    Fetch,
    Hello,
    Proof,
    Ready,
    Reject,
    Result,
    Setup,
    Stop,
    Tensor,
    Welcome,
    WorkerSettings,
)
from pcp_core.wire.transport import Connection, TransportError, TransportOptions
from pcp_core.worker.clock import NetworkClock
from pcp_core.worker.state import InnerStateStore

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
    transport_options: TransportOptions  # timeout_s: how long the shepherd may be silent
    state_dir: Path
    name: str = ""
    data: Path | None = None  # a prepared dataset on this machine (else shards are fetched)
    shard_cache: Path | None = None  # where fetched shards are kept (default: user cache)
    on_joined: Callable[[], None] | None = None  # called once joined, the program loaded


@dataclass
class WorkerSession:
    """What an algorithm's worker side works with during a round."""

    index: int
    executor: Executor
    corpus: Any  # its training data: the shipped tokens, or its assigned shards
    settings: WorkerSettings

    def batches(self, assignment: Assignment, call: int) -> tuple[np.ndarray, np.ndarray]:
        """Deterministic batches from this worker's shard for this round: the round's
        piece of a shipped text corpus, or all of the prepared shards it was given (those
        were shared out at the join)."""
        shipped_whole = self.settings.manifest is None
        return self.corpus.batches(
            "train",
            self.settings.steps_per_call,
            self.settings.batch_size,
            self.settings.block_size,
            stream=(assignment.seed, assignment.round, self.index, call),
            shard=(assignment.shard_index, assignment.shard_count) if shipped_whole else (0, 1),
        )


@dataclass
class RoundWork:
    """What an algorithm's worker side returns for a round."""

    losses: list[float]
    compute_s: float
    tensors: list[Tensor]  # the pseudo-gradient, in the order of the parameter specs


WorkerRound = Callable[[WorkerSession, Assignment], RoundWork]


def join(conn: Connection, hello: Hello, secret: bytes | None) -> tuple[Welcome, SealedConnection]:
    """The handshake; returns the Welcome (index, heartbeat interval) and the connection
    as the authenticated channel every later message travels on."""
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
    keys = session_keys(secret, challenge.nonce, own_nonce, hello, answer)
    return answer, SealedConnection(conn, keys.worker_to_shepherd, keys.shepherd_to_worker)


@dataclass(frozen=True)
class ShippedSpecs:
    """The tensor specs a Setup announces, as a runtime's `open` reads them."""

    param_specs: list[TensorSpec]
    opt_specs: list[TensorSpec]


def load_setup(
    setup: Setup, options: WorkerOptions, backend: Backend, conn: LiveConnection
) -> tuple[Executor, Any, WorkerSettings]:
    """Check the shipped program's kind and hash, load it on the device, set the inner
    state, and get the training data: the tokens in the Setup, or the assigned shards
    (from `--data`, the shard cache, or fetched through `conn`)."""
    runtime = backend.runtime
    if setup.artifact_kind != runtime.kind:
        raise JoinRefused(
            f"the shepherd sent a {setup.artifact_kind!r} program; backend "
            f"{backend.name!r} runs {runtime.kind!r}"
        )
    tensors = {t.name: t.array for t in setup.tensors}
    artifact = tensors.pop("artifact").tobytes()
    digest = hashlib.sha256(artifact).hexdigest()
    if digest != setup.artifact_sha256:
        raise JoinRefused(
            f"program hash mismatch: got {digest[:16]}…, "
            f"announced {setup.artifact_sha256[:16]}…; refusing to load it"
        )
    try:
        settings = WorkerSettings.from_json(setup.settings_json)
    except ValueError as error:
        raise JoinRefused(str(error)) from None
    specs = ShippedSpecs(
        [TensorSpec(n, s, d) for n, s, d in settings.param_specs],
        [TensorSpec(n, s, d) for n, s, d in settings.opt_specs],
    )
    if settings.manifest is not None:  # before the program: a wrong --data fails at once
        source = ShardSource(
            options.data, options.shard_cache or default_shard_cache(), conn.send, conn.receive
        )
        dataset = shard_dataset(settings.manifest, source)
    else:
        tokens = tensors["tokens"].astype(np.int32)
        dataset = CharCorpus(list(settings.vocabulary or ()), tokens, tokens[:0], "shepherd")
    executor = runtime.open(artifact, backend, specs, options.device)
    executor.set_opt_state([tensors[s.name] for s in specs.opt_specs])
    return executor, dataset, settings


@dataclass
class InnerState:
    """Which round's end the executor's inner state is, and the saved states behind it."""

    session: WorkerSession
    store: InnerStateStore
    run_id: str
    after_round: int | None = None  # None: the fresh state from the Setup

    def prepare(self, round_index: int) -> None:
        """Make the executor hold the state round `round_index` starts from, if saved.
        A worker that missed rounds goes on from its own last state, as DiLoCo's workers
        do; but where it ran later rounds and the state before this one is gone (pruned,
        or damaged), a warning says the run leaves the trajectory it would have had."""
        if self.after_round == round_index - 1:
            return
        saved = self.store.load(self.run_id, before_round=round_index)
        newest = self.store.newest_round(self.run_id)
        lost = newest is not None and newest >= round_index
        if lost and (saved is None or saved[0] != round_index - 1):
            log.warning(
                "the inner state this round started from is gone; it starts from "
                + ("a fresh one" if saved is None else "an older one")
                + ", so the run is no longer the one it would have been",
                round=round_index,
            )
        if saved is None:
            return
        self.after_round, arrays = saved
        self.session.executor.set_opt_state(arrays)
        log.info("inner state restored", after_round=self.after_round, for_round=round_index)

    def finished(self, round_index: int) -> None:
        self.after_round = round_index
        state = self.session.executor.opt_state()
        keep = self.session.settings.inner_states_kept
        self.store.save(self.run_id, self.session.index, round_index, state, keep)

    def refused(self, round_index: int) -> None:
        """The shepherd refused this round's result (NaN, say): the next round starts
        from the state this one started from, not from whatever this round left; it is
        saved again under this round, as if the round had changed nothing."""
        self.store.forget(round_index)
        self.after_round = None
        saved = self.store.load(self.run_id, before_round=round_index)
        if saved is not None:
            self.session.executor.set_opt_state(saved[1])
            self.finished(round_index)


def run_worker(options: WorkerOptions, plugins: Any) -> None:
    """Join, then serve rounds until the shepherd says stop."""
    backend = plugins.backend(options.backend)
    arch = backend.resolve_arch(options.target, options.device)
    backend.runtime.require_device(backend, options.device)  # fail early
    store = InnerStateStore(options.state_dir)
    transport = plugins.transport(options.transport)
    name = options.name or f"{socket.gethostname()}:{os.getpid()}"
    hello = Hello(
        name,
        backend.name,
        arch,
        json.dumps(backend.runtime.worker_report(backend)),
        str(options.device or 0),
        store.previous_index(),
    )
    raw = transport.connect(options.host, options.port, options.transport_options)
    try:
        welcome, sealed = join(raw, hello, options.secret)
    except BaseException:
        raw.close()
        raise
    conn = LiveConnection(sealed)
    try:
        conn.start_heartbeats(welcome.heartbeat_s)
        log.info(
            "joined",
            shepherd=f"{options.host}:{options.port}",
            index=welcome.worker_index,
            arch=arch,
        )
        setup = conn.receive()
        if isinstance(setup, Reject):
            raise JoinRefused(setup.reason)
        if not isinstance(setup, Setup):
            raise JoinRefused(f"expected the program, got {type(setup).__name__}")
        try:
            executor, corpus, settings = load_setup(setup, options, backend, conn)
        except (JoinRefused, DataError) as error:
            conn.send(Failure(str(error)))
            raise
        conn.send(Ready())
        if options.on_joined is not None:
            options.on_joined()
        session = WorkerSession(welcome.worker_index, executor, corpus, settings)
        worker_round: WorkerRound = plugins.algorithm(settings.algorithm).worker_round
        serve(conn, session, worker_round, InnerState(session, store, settings.run_id))
    finally:
        conn.close()


def serve(
    conn: LiveConnection, session: WorkerSession, worker_round: WorkerRound, inner: InnerState
) -> None:
    """Rounds until Stop: Assignment -> Result; then Fetch -> Delta, or Discard (also
    after the Delta, when its tensors failed the shepherd's checks)."""
    pending: tuple[Assignment, RoundWork] | None = None
    clock = NetworkClock()
    while True:
        message = clock.receive(conn)
        if isinstance(message, Stop):
            log.info("stopping", reason=message.reason)
            return
        if isinstance(message, Assignment):
            inner.prepare(message.round)
            work = worker_round(session, message)
            inner.finished(message.round)
            norm = delta_norm([t.array for t in work.tensors])
            waited_s, sent_s = clock.take()
            timings = (work.compute_s, norm, waited_s, sent_s)
            clock.send(conn, Result(message.round, message.attempt, work.losses, *timings))
            pending = (message, work)
        elif isinstance(message, Fetch | Discard):
            asked = (message.round, message.attempt)
            if pending is None or (pending[0].round, pending[0].attempt) != asked:
                raise TransportError(f"the shepherd asked about round {asked}, not ours")
            if isinstance(message, Fetch):  # pending stays: the tensors may fail a check
                clock.send(conn, Delta(message.round, message.attempt, pending[1].tensors))
            else:
                log.warning("result refused", round=message.round, reason=message.reason)
                inner.refused(message.round)
                pending = None
        else:
            raise TransportError(f"unexpected {type(message).__name__} from the shepherd")
