"""`pcp worker`: join a shepherd and train on this machine's device, supervised."""

import math
import sys
from pathlib import Path
from typing import Optional

import structlog
import typer

from pcp_core import exit_codes, plugins
from pcp_core.cli.common import fail, run_or_explain
from pcp_core.settings import MAX_SECONDS, MIN_SECONDS

log = structlog.get_logger(__name__)


def worker(
    connect: str = typer.Option(..., "--connect", help="The shepherd's HOST:PORT."),
    backend: str = typer.Option(
        "cpu",
        "--backend",
        help="Hardware backend to run on; auto: the fastest that `pcp devices` finds usable "
        "here (xla on a GPU, then cuda, rocm, metal, vulkan on real hardware, cpu).",
    ),
    target: Optional[str] = typer.Option(  # noqa: UP045
        None, "--target", help="Device architecture (default: detect)."
    ),
    device: Optional[int] = typer.Option(  # noqa: UP045
        None, "--device", help="Device index (default: first)."
    ),
    devices: Optional[str] = typer.Option(  # noqa: UP045
        None,
        "--devices",
        help="Train on several devices of this machine as one worker, data-parallel: "
        "'all' or indices such as 0,1 (the xla backend; IREE backends run one worker per "
        "device). The shepherd sees one worker and gets one result a round.",
    ),
    token_file: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--token-file",
        help="File holding the secret shared by every worker (else $PCP_TOKEN): for a "
        "trusted cluster.",
    ),
    credential: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--credential",
        help="This worker's own credential (`pcp token issue NAME` on the shepherd's "
        "machine): it joins under that name, and can be revoked alone.",
    ),
    transport: str = typer.Option("capnp-tcp", "--transport", help="Transport to the shepherd."),
    tls_ca: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--tls-ca", help="CA (PEM) to verify the shepherd's TLS certificate; enables TLS."
    ),
    timeout: float = typer.Option(
        30.0,
        "--timeout",
        help="Seconds the shepherd may stay silent (it sends heartbeats) before this worker "
        "gives up on the connection and, supervised, reconnects.",
    ),
    state_dir: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--state-dir",
        help="Where the inner optimizer state is saved after each round, so a restarted "
        "worker resumes it. Default: a folder per shepherd address and backend in the "
        "user state directory.",
    ),
    data: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--data",
        help="A prepared dataset (`pcp data prepare`) on this machine: the shards the "
        "shepherd assigns are read from it, checked against the shepherd's sha256, instead "
        "of fetched.",
    ),
    shard_cache: Optional[Path] = typer.Option(  # noqa: UP045
        None,
        "--shard-cache",
        help="Where shards fetched from the shepherd are kept, by content hash, so a "
        "restarted worker fetches none twice. Default: the user cache directory.",
    ),
    restarts: int = typer.Option(
        5,
        "--restarts",
        help="Restart after a crash, with backoff, up to this many times in a row (a join, "
        "or a run of over a minute, resets the count); 0: never, and no reconnecting.",
    ),
    give_up_after: float = typer.Option(
        3600.0,
        "--give-up-after",
        help="Seconds to keep reconnecting, with backoff up to 30 s, while the shepherd is "
        "out of reach (restarting, or the network down; a worker cannot tell a finished "
        "run from those), counted from the last join.",
    ),
) -> None:
    """Join a shepherd and train on this machine's device until told to stop."""
    # imported here, not at the top: keeps `pcp --help` fast
    from pcp_core.wire.transport import TransportError, TransportOptions
    from pcp_core.worker import loop as worker_runtime

    host, _, port = connect.rpartition(":")
    if not host or not port.isdigit():
        fail(f"--connect must be HOST:PORT, got {connect!r}")
    if not (math.isfinite(timeout) and MIN_SECONDS <= timeout <= MAX_SECONDS):
        fail(f"--timeout must be from {MIN_SECONDS:g} to {MAX_SECONDS:g} seconds, got {timeout}")
    if not (math.isfinite(give_up_after) and give_up_after >= 0):
        fail(f"--give-up-after must be a number of seconds, got {give_up_after}")
    if restarts < 0:
        fail(f"--restarts must not be negative, got {restarts}")
    if devices is not None and device is not None:
        fail("--device and --devices name the same thing: give one")
    if backend == "auto":
        backend = auto_backend_here()
    # imported here, not at the top: keeps `pcp --help` fast
    from pcp_core.wire.auth import AuthError
    from pcp_core.wire.handshake import JoinRefused

    try:  # before the supervisor starts: a restart cannot fix these
        worker_key(token_file, credential)
    except AuthError as error:
        fail(str(error))
    if tls_ca is not None and not tls_ca.is_file():
        fail(f"--tls-ca {tls_ca}: no such file")
    if data is not None and not (data / "manifest.json").is_file():
        fail(
            f"--data {data}: not a dataset directory (no manifest.json); "
            "make one with `pcp data prepare INPUT... -o DIR`"
        )
    if restarts > 0:
        # imported here, not at the top: keeps `pcp --help` fast
        from pcp_core.iree.malloc import retaining_env
        from pcp_core.worker.supervisor import Supervisor

        command = [sys.executable, "-m", "pcp_core", *sys.argv[1:], "--restarts", "0"]
        supervisor = Supervisor(
            command, env=retaining_env(), max_restarts=restarts, give_up_after_s=give_up_after
        )
        raise typer.Exit(supervisor.serve())

    def body() -> None:
        # imported here, not at the top: keeps `pcp --help` fast
        from pcp_core.worker.state import StateDirBusy, default_state_dir
        from pcp_core.worker.supervisor import die_with_parent, mark_joined

        die_with_parent()
        chosen = device if devices is None else chosen_devices(backend, devices)
        if chosen is None:
            chosen = device_of_rank(backend)
        try:
            secret, name, serial = worker_key(token_file, credential)
            options = worker_runtime.WorkerOptions(
                host=host.strip("[]"),
                port=int(port),
                backend=backend,
                target=target,
                device=chosen,
                secret=secret,
                name=name,
                credential=serial,
                transport=transport,
                transport_options=TransportOptions(timeout_s=timeout, tls_ca=tls_ca),
                state_dir=state_dir or default_state_dir(host, port, backend, chosen),
                data=data,
                shard_cache=shard_cache,
                on_joined=mark_joined,
            )
            worker_runtime.run_worker(options, plugins.host())
        except (JoinRefused, AuthError, StateDirBusy) as error:
            typer.secho(f"error: refused: {error}", fg=typer.colors.RED, err=True)
            raise typer.Exit(exit_codes.REFUSED) from None
        except (TransportError, ConnectionError, TimeoutError) as error:
            fail(f"lost the shepherd: {error}", code=exit_codes.UNREACHABLE)

    run_or_explain(body)


def worker_key(token_file: Path | None, credential: Path | None) -> tuple[bytes | None, str, str]:
    """The secret to prove, the name to join under ("": the host and pid) and the
    credential's serial ("": a shared secret); AuthError for a bad or missing file."""
    from pcp_core.wire.auth import AuthError, load_secret
    from pcp_core.wire.credentials import load_credential

    if credential is not None:
        if token_file is not None:
            raise AuthError("--credential and --token-file: give one of them")
        own = load_credential(credential)
        return own.secret, own.name, own.serial
    return load_secret(token_file), "", ""


def chosen_devices(backend_name: str, devices: str) -> tuple[int, ...]:
    """`--devices` as device indices of `backend_name`; exits with a one-line error for
    a backend that drives one device per worker, or devices this machine lacks."""
    from pcp_core.backends import multi_device, parse_devices

    backend = plugins.host().backend(backend_name)
    if not multi_device(backend):
        fail(
            f"--devices: a {backend_name} worker drives one device; start one worker per "
            "device (--device N), or use --backend xla to train on several in one worker"
        )
    found = backend.runtime.describe_devices(backend)
    try:
        return parse_devices(devices, len(found.devices))
    except ValueError as error:
        fail(f"{error}{f' ({found.note})' if found.note else ''}")


def auto_backend_here() -> str:
    """`--backend auto`: the backend picked from this machine's devices, logged."""
    from pcp_core.backends import auto_backend

    backends = plugins.host().registries["backend"].values()
    reports = [backend.runtime.describe_devices(backend) for backend in backends]
    chosen = auto_backend(reports)
    if chosen is None:
        fail("--backend auto: no installed backend finds a device here (see `pcp devices`)")
    log.info("backend chosen", backend=chosen, by="auto")
    return chosen


def device_of_rank(backend_name: str) -> int | None:
    """In an MPI or Slurm job (`mpirun -n 4 pcp worker ...`), the device of this
    worker's rank on the node, on a machine with several; else None (the first)."""
    from pcp_core.launch.ranks import device_for, job_rank

    rank = job_rank()
    if rank is None:
        return None
    backend = plugins.host().backend(backend_name)
    count = len(backend.runtime.describe_devices(backend).devices)
    chosen = device_for(rank, count)
    log.info(
        "job rank", rank=rank.rank, local_rank=rank.local_rank, source=rank.source, device=chosen
    )
    return chosen


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
