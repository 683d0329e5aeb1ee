"""A worker's join: connect to the shepherd, prove it knows the secret (the worker's half
of `pcp_core.wire.handshake`), then take its Setup: check the shipped program's kind and
hash, decode its settings (the algorithm's slot into the type it declares, once), get its
data (the tokens in the Setup, or its shards from `--data`, the shard cache or the
shepherd), load the program on the device, set the inner state, and say Ready, or send a
Failure that says why it cannot. The shepherd's side is
`pcp_core.shepherd.admission` and `pcp_core.shepherd.provisioning`.
"""

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import structlog

from pcp_core.algorithms import Algorithm
from pcp_core.backends import (
    Backend,
    DeviceChoice,
    Executor,
    MultiDeviceRuntime,
    device_label,
)
from pcp_core.codecs import CodecError, CodecLookup
from pcp_core.data.errors import DataError
from pcp_core.data.text import CharCorpus
from pcp_core.program.build import TensorSpec
from pcp_core.registry import UnknownNameError
from pcp_core.wire.handshake import JoinRefused, join
from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import Failure, Hello, Ready, Reject, Setup, Welcome, WorkerSettings
from pcp_core.wire.shard_transfer import ShardSource, default_shard_cache, shard_dataset
from pcp_core.wire.transport import TransportOptions

log = structlog.get_logger(__name__)


class SetupLookup(CodecLookup, Protocol):
    """What loading a Setup looks up by name: the run's codecs and its algorithm (the run's
    plugin host)."""

    def algorithm(self, name: str) -> Algorithm: ...


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


def join_shepherd(
    options: WorkerOptions, plugins: Any, backend: Backend, arch: str, previous_index: int
) -> tuple[Welcome, LiveConnection]:
    """Connect and join as a worker of `backend`/`arch` that had `previous_index` (-1:
    none): the Welcome, and the sealed connection, its heartbeats not started yet."""
    transport = plugins.transport(options.transport)
    name = options.name or f"{socket.gethostname()}:{os.getpid()}"
    hello = Hello(
        name,
        backend.name,
        arch,
        json.dumps(backend.runtime.worker_report(backend)),
        device_label(options.device),
        previous_index,
        options.credential,
    )
    raw = transport.connect(options.host, options.port, options.transport_options)
    try:
        welcome, sealed = join(raw, hello, options.secret)
    except BaseException:
        raw.close()
        raise
    return welcome, LiveConnection(sealed)


def take_setup(
    conn: LiveConnection, options: WorkerOptions, backend: Backend, plugins: SetupLookup
) -> tuple[Setup, Executor, Any, WorkerSettings]:
    """Receive the Setup, load it (`load_setup`) and say Ready: the Setup, the loaded
    program, the training data and the settings. JoinRefused or DataError, the shepherd
    told why, where it cannot be loaded."""
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
    return setup, executor, corpus, settings


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
    plugins: SetupLookup,
) -> tuple[Executor, Any, WorkerSettings]:
    """Check the shipped program's kind and hash, decode the settings, load the program
    on the device, set the inner state, and get the training data: the tokens in the
    Setup, or the assigned shards (from `--data`, the shard cache, or fetched through
    `conn`)."""
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
    settings = decode_settings(setup.settings_json, plugins)
    for name, codec, what in (
        (settings.codec, settings.uplink, "pseudo-gradients"),
        (settings.codec_down, settings.downlink, "parameters"),
    ):
        try:
            codec(plugins)  # else the first round would fail
        except (UnknownNameError, CodecError) as error:
            raise JoinRefused(f"the run sends {what} as {name}: {error}") from None
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


def decode_settings(text: str, plugins: SetupLookup) -> WorkerSettings:
    """The Setup's settings, the algorithm's slot decoded into the type it declares
    (`Algorithm.worker_settings`): once, here, for every round to read as it is
    (`WorkerSession.algorithm_settings`). JoinRefused, one line, where it cannot be."""
    try:
        settings = WorkerSettings.from_json(text)
        algorithm = plugins.algorithm(settings.algorithm)
        return settings.with_typed(settings.algorithm, algorithm.worker_settings)
    except UnknownNameError as error:
        raise JoinRefused(f"the run's rounds need its algorithm: {error}") from None
    except ValueError as error:
        raise JoinRefused(str(error)) from None
