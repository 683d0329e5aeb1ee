"""What every distributed algorithm's shepherd side shares: the secret policy, the
listener, and the local workers of the one-command form (`pcp train --workers N`)."""

import collections
import contextlib
import errno
import ssl
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from pcp_core.algorithms import RunContext
from pcp_core.backends import DeviceChoice, device_label, multi_device
from pcp_core.config import DEFAULT_PORT, ConfigError, RunConfig
from pcp_core.iree.malloc import retaining_env
from pcp_core.program.training import TrainingSetup
from pcp_core.shepherd.accountability import Accountability, Policy
from pcp_core.shepherd.admission import Admission
from pcp_core.shepherd.local_workers import LocalWorkers
from pcp_core.shepherd.merging import Merger
from pcp_core.shepherd.roster import Limits
from pcp_core.shepherd.session import Shepherd
from pcp_core.shepherd.spot_checks import SpotChecks
from pcp_core.wire import auth
from pcp_core.wire.liveness import heartbeat_interval
from pcp_core.wire.messages import RunSettings
from pcp_core.wire.transport import Listener, TransportOptions

log = structlog.get_logger(__name__)


def listener_options(config: RunConfig) -> TransportOptions:
    """Server-side TLS only: workers prove who they are with the shared secret. Every read
    waits at most --worker-timeout: heartbeats come four times as often."""
    net = config.shepherd
    if (net.tls_cert is None) != (net.tls_key is None):
        raise ConfigError("TLS needs both --tls-cert and --tls-key")
    return TransportOptions(
        timeout_s=net.worker_timeout, tls_cert=net.tls_cert, tls_key=net.tls_key
    )


@dataclass
class Endpoint:
    """A shepherd's secret and bound listener, opened before any heavy work so that a
    missing secret, a busy port or a bad TLS file stops the run at once."""

    keys: auth.Keys | None  # None: a secret is generated for loopback workers (`shepherd`)
    listener: Listener

    def close(self) -> None:
        self.listener.close()


def open_endpoint(config: RunConfig, plugins: Any, local_workers: bool) -> Endpoint:
    """Check the secret policy and the TLS files, and bind the listener.

    A shepherd never listens beyond loopback without a configured secret. Errors are
    ConfigErrors of one line naming the flag or file at fault.
    """
    net = config.shepherd
    for flag, path in (
        ("--tls-cert", net.tls_cert),
        ("--tls-key", net.tls_key),
        ("--tls-ca", net.tls_ca),
    ):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{flag} {path}: no such file")
    options = listener_options(config)
    keys = shepherd_keys(config, local_workers)
    if keys is None and not auth.is_loopback(net.host):
        raise ConfigError(
            f"refusing to listen on {net.host} without a secret: pass --issuer-key FILE "
            "(a credential per worker: `pcp token issue`), or --token-file FILE or PCP_TOKEN "
            "(one secret shared by trusted workers)"
        )
    port = net.port if net.port is not None else (0 if local_workers else DEFAULT_PORT)
    transport = plugins.transport(net.transport)
    try:
        listener = transport.listen(net.host, port, options)
    except ssl.SSLError as error:
        raise ConfigError(
            f"--tls-cert {net.tls_cert} and --tls-key {net.tls_key} do not make a "
            f"usable TLS key pair: {error.reason or error}"
        ) from None
    except OSError as error:
        busy = error.errno == errno.EADDRINUSE
        hint = " (is another shepherd running there? pick another --port)" if busy else ""
        # without the "(while attempting to bind on address ...)" socket.create_server adds
        why = (error.strerror or str(error)).split(" (while attempting")[0]
        raise ConfigError(f"cannot listen on {net.host}:{port}: {why or error}{hint}") from None
    return Endpoint(keys, listener)


def shepherd_keys(config: RunConfig, local_workers: bool) -> auth.Keys | None:
    """Per-worker credentials under --issuer-key, else the shared secret, else None."""
    net = config.shepherd
    try:
        if net.issuer_key is not None:
            if net.token_file is not None:
                raise ConfigError("--issuer-key and --token-file: give one of them")
            if local_workers:
                raise ConfigError(
                    "--issuer-key: the workers `pcp train` starts share a secret of their "
                    "own; give credentials to workers started with `pcp worker`"
                )
            from pcp_core.wire.credentials import IssuedKeys  # here: only shepherds need it

            return IssuedKeys(net.issuer_key)
        secret = auth.load_secret(net.token_file)
    except auth.AuthError as error:
        raise ConfigError(str(error)) from None
    return None if secret is None else auth.SharedSecret(secret)


def generated_secret(run_dir: Path, announce: bool) -> bytes:
    """A fresh secret for loopback workers, written to RUN_DIR/token (mode 0600)."""
    token_path = run_dir / "token"
    secret = auth.write_secret(token_path)
    if announce:
        log.info("generated a shared secret for loopback workers", token_file=str(token_path))
    return secret


def local_devices(config: RunConfig, plugins: Any) -> list[DeviceChoice]:
    """The device(s) of each local worker: --device for all of them when given, else
    the workers of one backend take its devices in turn, so two cuda workers on a
    machine with two GPUs get one each, and with --devices-per-worker 2 on four GPUs,
    two each. ConfigError where that many devices are not there to take."""
    backends = config.local_worker_backends()
    per_worker = config.shepherd.devices_per_worker
    if per_worker > 1:
        if config.batch_size % per_worker:
            raise ConfigError(
                f"--batch-size {config.batch_size} does not split over "
                f"--devices-per-worker {per_worker}: make it a multiple of {per_worker}"
            )
        return _device_groups(backends, per_worker, plugins, config.device)
    if config.device is not None:
        return [config.device] * len(backends)
    counts: dict[str, int] = {}
    for name in {b for b in backends if backends.count(b) > 1}:
        backend = plugins.backend(name)
        counts[name] = max(1, len(backend.runtime.describe_devices(backend).devices))
    taken: collections.Counter[str] = collections.Counter()
    devices: list[DeviceChoice] = []
    for name in backends:
        devices.append(taken[name] % counts[name] if name in counts else None)
        taken[name] += 1
    return devices


def _device_groups(
    backends: list[str], per_worker: int, plugins: Any, device: int | None
) -> list[DeviceChoice]:
    """`per_worker` consecutive devices for each worker of each backend."""
    if device is not None:
        raise ConfigError("--device names one device: leave it out with --devices-per-worker")
    groups: list[DeviceChoice] = []
    taken: collections.Counter[str] = collections.Counter()
    for name in backends:
        backend = plugins.backend(name)
        if not multi_device(backend):
            raise ConfigError(
                f"--devices-per-worker {per_worker}: a {name} worker drives one device; "
                "use the xla backend, or one worker per device"
            )
        found = backend.runtime.describe_devices(backend).devices
        first = taken[name] * per_worker
        if first + per_worker > len(found):
            raise ConfigError(
                f"{backends.count(name)} {name} worker(s) with --devices-per-worker "
                f"{per_worker} need {backends.count(name) * per_worker} devices; "
                f"this machine has {len(found)} (`pcp devices`)"
            )
        groups.append(tuple(range(first, first + per_worker)))
        taken[name] += 1
    return groups


def worker_command(
    config: RunConfig,
    address: tuple[str, int],
    backend: str,
    state_dir: Path,
    device: DeviceChoice = None,
) -> list[str]:
    """The command line of one local worker (supervised by this process, so no restarts).

    `device` (see `local_devices`) goes to the worker whatever its backend, as the run
    checked --device for each before starting them (several as --devices); --target only
    to those of the run's backend."""
    connect = f"{address[0]}:{address[1]}"
    command = [sys.executable, "-m", "pcp_core", "worker", "--connect", connect]
    command += ["--backend", backend, "--transport", config.shepherd.transport, "--restarts", "0"]
    command += ["--timeout", str(config.shepherd.worker_timeout), "--state-dir", str(state_dir)]
    if isinstance(device, tuple):
        command += ["--devices", device_label(device)]
    elif device is not None:
        command += ["--device", str(device)]
    if config.target and backend == config.backend:
        command += ["--target", config.target]
    if config.shepherd.tls_ca:
        command += ["--tls-ca", str(config.shepherd.tls_ca)]
    if config.data is not None and Path(config.data).is_dir():  # a prepared dataset: read it
        command += ["--data", str(config.data)]
    return command


@contextlib.contextmanager
def shepherd(ctx: RunContext, setup: TrainingSetup, settings: RunSettings) -> Iterator[Shepherd]:
    """A listening shepherd (plus local workers in the one-command form), closed on exit.

    It listens on `ctx.endpoint` when the caller opened one before building the program
    (the CLI does, see `open_endpoint`), else opens its own.

    `settings` go to every worker with its program (`pcp_core.wire.messages.RunSettings`:
    the algorithm's name, the run's id that a worker's saved inner state must match, and
    a slot for what the algorithm's worker side reads).
    """
    config = ctx.config
    # validation runs on the shepherd's --backend; its program is built now, before workers
    # are admitted (they wait in the listen queue), not at the first evaluation, where it
    # held every worker for 40 s (an xla shepherd on one core of an H200 machine)
    setup.evaluator.load()
    endpoint = ctx.endpoint or open_endpoint(config, ctx.plugins, ctx.local_workers)
    keys = endpoint.keys or auth.SharedSecret(
        generated_secret(ctx.run_dir, announce=not ctx.local_workers)
    )
    listener = endpoint.listener
    admission = _admission(ctx, setup, settings, listener, keys)
    node = _node(ctx, setup, settings, admission)
    node.start()
    log.info(
        "shepherd listening",
        address=f"{listener.address[0]}:{listener.address[1]}",
        transport=config.shepherd.transport,
        waiting_for=config.shepherd.workers,
    )
    workers: contextlib.AbstractContextManager = contextlib.nullcontext()
    if ctx.local_workers:
        workers = _local_workers(ctx, keys, listener.address)
    try:
        with workers as local:
            if local is not None:
                node.still_coming = local.any_running
            reason = "interrupted"
            try:
                yield node
                reason = "done"
            except KeyboardInterrupt:
                reason = "interrupted (Ctrl-C on the shepherd)"
                raise
            except BaseException as error:
                reason = f"the shepherd failed: {type(error).__name__}: {error}"
                raise
            finally:
                node.close(reason)
    finally:
        listener.close()


def _admission(
    ctx: RunContext,
    setup: TrainingSetup,
    settings: RunSettings,
    listener: Listener,
    keys: auth.Keys,
) -> Admission:
    """What admits workers on `listener`: checks their secret, serves them the run's program."""
    config = ctx.config
    return Admission(
        setup=setup,
        listener=listener,
        keys=keys,
        plugins=ctx.plugins,
        settings=settings,
        heartbeat_s=heartbeat_interval(config.shepherd.worker_timeout),
        serves=config.shepherd.served(),
        status=ctx.status,
    )


def _node(
    ctx: RunContext, setup: TrainingSetup, settings: RunSettings, admission: Admission
) -> Shepherd:
    """The shepherd, with the limits, merging and spot checks its settings ask for."""
    config = ctx.config
    limits = Limits(
        min_workers=config.shepherd.min_workers,
        worker_timeout_s=config.shepherd.worker_timeout,
        round_timeout_s=config.shepherd.round_timeout,
        join_timeout_s=config.shepherd.join_timeout,
    )
    accountability = Accountability(Policy(quarantine_after=config.shepherd.quarantine_after))
    scorer = setup.scoring_losses if config.shepherd.result_check == "loss" else None
    aggregator = ctx.plugins.aggregator(config.shepherd.aggregator)
    spot_checks = None
    if config.shepherd.spot_check:
        worker_round = ctx.plugins.algorithm(settings.algorithm).worker_round
        spot_checks = SpotChecks(config.shepherd.spot_check, settings, admission, worker_round)
    merger = Merger(aggregator, accountability, scorer)
    return Shepherd(admission, limits, merger, spot_checks=spot_checks)


def _local_workers(ctx: RunContext, keys: auth.Keys, address: tuple[str, int]) -> LocalWorkers:
    """The one-command form's workers, started with the run's secret to join at `address`."""
    config = ctx.config
    # shepherd_keys refuses --issuer-key with local workers: they share a secret
    assert isinstance(keys, auth.SharedSecret)
    env = {**retaining_env(), auth.TOKEN_ENV: keys.secret.decode()}
    backends, devices = config.local_worker_backends(), local_devices(config, ctx.plugins)
    commands = [
        worker_command(config, address, backend, ctx.run_dir / f"worker-{i}", device)
        for i, (backend, device) in enumerate(zip(backends, devices, strict=True))
    ]
    return LocalWorkers(commands, env, Path(ctx.run_dir))
