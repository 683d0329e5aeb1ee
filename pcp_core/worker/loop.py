"""The worker: join a shepherd, load the program it ships, train when asked.

The algorithm (named in the shepherd's Setup) decides what a round is; this module
handles the join handshake, the program and data, heartbeats and the message loop, one
round at a time (`serve`) or with the next round computing while the last one's result
travels (`pcp_core.worker.overlap`, when the run asks for it); the inner optimizer state
across rounds is `pcp_core.worker.session.InnerState`.

Losing the shepherd (silent past the timeout, or gone) ends the process with the
"crashed" exit code; its supervisor starts it again, and it rejoins.
"""

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import structlog

from pcp_core.backends import (
    Backend,
    DeviceChoice,
    Executor,
    MultiDeviceRuntime,
    device_indices,
    device_label,
)
from pcp_core.codecs import CodecLookup
from pcp_core.data.errors import DataError
from pcp_core.data.text import CharCorpus
from pcp_core.program.build import SCHEDULE_TENSOR, TensorSpec
from pcp_core.registry import UnknownNameError
from pcp_core.wire import auth
from pcp_core.wire.channel import SealedConnection, session_keys
from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import (
    Assignment,
    Audit,
    Challenge,
    Discard,
    Failure,
    Fetch,
    Hello,
    Proof,
    Ready,
    Reject,
    Setup,
    Stop,
    Welcome,
    WorkerSettings,
)
from pcp_core.wire.shard_transfer import ShardSource, default_shard_cache, shard_dataset
from pcp_core.wire.transport import Connection, TransportError, TransportOptions
from pcp_core.worker.overlap import OverlappedRounds
from pcp_core.worker.reports import Reports
from pcp_core.worker.session import InnerState, WorkerRound, WorkerSession
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
    device: DeviceChoice  # several only for a multi_device backend (`pcp worker --devices`)
    secret: bytes | None
    transport: str
    transport_options: TransportOptions  # timeout_s: how long the shepherd may be silent
    state_dir: Path
    name: str = ""
    credential: str = ""  # the serial of its own credential (`secret` is then its secret)
    data: Path | None = None  # a prepared dataset on this machine (else shards are fetched)
    shard_cache: Path | None = None  # where fetched shards are kept (default: user cache)
    on_joined: Callable[[], None] | None = None  # called once joined, the program loaded


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
    setup: Setup,
    options: WorkerOptions,
    backend: Backend,
    conn: LiveConnection,
    codecs: CodecLookup,
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
    for codec, what in ((settings.codec, "pseudo-gradients"), (settings.codec_down, "parameters")):
        try:
            codecs.codec(codec)  # else the first round would fail
        except UnknownNameError as error:
            raise JoinRefused(f"the run sends {what} as {codec}: {error}") from None
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
        vocabulary = "".join(settings.vocabulary or ())  # a CharCorpus's, character by character
        dataset = CharCorpus(vocabulary, tokens, tokens[:0], "shepherd")
    started = time.monotonic()  # an `xla` worker compiles here, an IREE one loads its module
    if isinstance(options.device, tuple):  # only for a multi_device runtime (`pcp worker`)
        several = cast(MultiDeviceRuntime, runtime)
        executor = several.open(artifact, backend, specs, options.device)
    else:
        executor = runtime.open(artifact, backend, specs, options.device)
    log.info("program ready", seconds=round(time.monotonic() - started, 1))
    executor.set_opt_state([tensors[s.name] for s in specs.opt_specs])
    return executor, dataset, settings


def run_worker(options: WorkerOptions, plugins: Any) -> None:
    """Join, then serve rounds until the shepherd says stop."""
    backend = plugins.backend(options.backend)
    arch = backend.resolve_arch(options.target, device_indices(options.device)[0])
    backend.runtime.require_device(backend, options.device)  # fail early
    store = InnerStateStore(options.state_dir)
    transport = plugins.transport(options.transport)
    name = options.name or f"{socket.gethostname()}:{os.getpid()}"
    hello = Hello(
        name,
        backend.name,
        arch,
        json.dumps(backend.runtime.worker_report(backend)),
        device_label(options.device),
        store.previous_index(),
        options.credential,
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
            executor, corpus, settings = load_setup(setup, options, backend, conn, plugins)
        except (JoinRefused, DataError) as error:
            conn.send(Failure(str(error)))
            raise
        conn.send(Ready())
        if options.on_joined is not None:
            options.on_joined()
        session = WorkerSession(welcome.worker_index, executor, corpus, settings)
        worker_round: WorkerRound = plugins.algorithm(settings.algorithm).worker_round
        schedule = {t.name: np.array(t.array) for t in setup.tensors if t.name == SCHEDULE_TENSOR}
        inner = InnerState(session, store, settings.run_id, from_setup=schedule)
        try:
            if settings.overlap:
                OverlappedRounds(conn, session, worker_round, inner, plugins).serve()
            else:
                serve(conn, session, worker_round, inner, plugins)
        finally:
            inner.saved()  # the last round's state on disk before the worker goes
    finally:
        conn.close()


def serve(
    conn: LiveConnection,
    session: WorkerSession,
    worker_round: WorkerRound,
    inner: InnerState,
    codecs: CodecLookup,
) -> None:
    """Rounds until Stop, one at a time: Assignment -> Result; then Fetch -> Delta, or
    Discard; in an audited run, Audit -> AuditState (`pcp_core.worker.reports`)."""
    reports = Reports(conn, inner, codecs)
    while True:
        message = reports.receive()
        if isinstance(message, Stop):
            log.info("stopping", reason=message.reason)
            return
        if isinstance(message, Assignment):
            inner.prepare(message.round)
            reports.started(message)
            reports.report(message, worker_round(session, message))
        elif isinstance(message, Fetch | Discard):
            reports.settle(message)
        elif isinstance(message, Audit):
            reports.audit(message)
        else:
            raise TransportError(f"unexpected {type(message).__name__} from the shepherd")
