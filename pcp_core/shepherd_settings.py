"""The `[shepherd]` section of the run config: the settings of a distributed run's
shepherd (the core's, which any distributed algorithm drives) and of the workers it
starts. It is the core's own section, read as `RunConfig.shepherd`; `pcp_core.config`
exports it with the run config, where plugins and docs/plugins.md name it.
"""

from dataclasses import dataclass
from pathlib import Path

from pcp_core.settings import MAX_SECONDS, MAX_STEPS, MIN_SECONDS, ConfigError, setting

# The section of the run config that distributed runs read (ShepherdSettings, below).
SHEPHERD = "shepherd"
DEFAULT_PORT = 7433  # the shepherd's, where `pcp shepherd` and `pcp launch` are given none


def _backend_names(text: str) -> str | None:
    return None if all(b.strip() for b in text.split(",")) else "has an empty name"


def _served_entries(text: str) -> str | None:
    return None if text.strip(", ") else "expects BACKEND or BACKEND:ARCH entries"


@dataclass(frozen=True)
class ShepherdSettings:
    """The `[shepherd]` section: what a distributed run's shepherd (the core's, which any
    distributed algorithm drives) and the workers it starts use. A local run has it but
    reads none of it; its flags are `pcp train`'s (`--workers`, `--port`, ...)."""

    workers: int = setting(2, "Workers to start (one-command form) or wait for.", low=1, high=10**4)
    worker_backends: str | None = setting(
        None,
        "One-command form: backend of each local worker, e.g. cpu,vulkan (sets --workers).",
        check=_backend_names,
    )
    devices_per_worker: int = setting(
        1,
        "One-command form: devices each local worker trains on data-parallel, as one "
        "worker (backends that can: xla); the workers of a backend take its devices in turn.",
        low=1,
        high=1024,
    )
    transport: str = setting("capnp-tcp", "Transport between shepherd and workers.")
    host: str = setting("127.0.0.1", "Address the shepherd listens on.")
    port: int | None = setting(
        None, "TCP port (default 7433; any free one for train).", low=0, high=65535
    )
    join_timeout: float = setting(
        600.0,
        "Seconds to wait for workers to join (at the start, or when too few are left).",
        low=0,
        high=MAX_SECONDS,
    )
    min_workers: int = setting(
        1,
        "Accepted results a round needs; below that it is retried or waits.",
        low=1,
        high=10**4,
    )
    worker_timeout: float = setting(
        30.0,
        "Seconds of silence after which a peer is declared dead (heartbeats every quarter).",
        low=MIN_SECONDS,
        high=MAX_SECONDS,
    )
    round_timeout: float | None = setting(
        None,
        "A round's deadline in seconds (default: 3x recent rounds + --worker-timeout).",
        low=MIN_SECONDS,
        high=MAX_SECONDS,
    )
    checkpoint_every: int = setting(
        1, "Write the resumable checkpoint every N rounds (and at the end).", low=1, high=MAX_STEPS
    )
    aggregator: str = setting(
        "centered-clip",
        "How a round's results are merged (`pcp plugins` lists them): centered-clip, "
        "trimmed-mean, median and geometric-median bound what a minority of workers can "
        "do; mean trusts every worker.",
    )
    result_check: str = setting(
        "loss",
        "loss: score each result by the loss of the round's merge with and without it, on "
        "training batches drawn anew each round, and leave out those the merge is better "
        "without (one evaluation of --eval-batches per result and round); none: no check.",
        choices=("loss", "none"),
    )
    spot_check: float = setting(
        0.0,
        "Fraction of results re-run on the shepherd from the worker's own starting state "
        "and compared (each costs a worker's round of compute here); a mismatch is a "
        "strike. Workers this machine can run (cpu); blocking rounds of whole models "
        "(docs/security.md). 0: none.",
        low=0.0,
        high=1.0,
    )
    quarantine_after: int = setting(
        3,
        "Quarantine a worker after N strikes (a result left out for its norm or its "
        "direction): disconnected, refused, listed in summary.json (0: never).",
        low=0,
        high=10**6,
    )
    serve: str | None = setting(
        None,
        "What the shepherd compiles for, as BACKEND or BACKEND:ARCH entries, e.g. "
        "cpu,cuda:sm_80 (default: any installed backend); other workers are refused.",
        check=_served_entries,
    )
    token_file: Path | None = setting(
        None,
        "File holding the secret shared by every worker (else $PCP_TOKEN): for a trusted "
        "cluster, where any holder joins under any name and none can be revoked alone.",
    )
    issuer_key: Path | None = setting(
        None,
        "Issuer key of per-worker credentials (`pcp token issue NAME`): each worker proves "
        "its own, is named by it, and can be revoked while the run goes on "
        "(`pcp token revoke NAME`).",
    )
    tls_cert: Path | None = setting(None, "TLS certificate (PEM) the shepherd presents.")
    tls_key: Path | None = setting(None, "TLS private key (PEM) for --tls-cert.")
    tls_ca: Path | None = setting(None, "CA (PEM) local workers use to verify --tls-cert.")

    def __post_init__(self) -> None:
        if self.worker_backends and _backend_names(self.worker_backends) is None:
            # --worker-backends names every worker, so it sets their number (the
            # dataclass is frozen: this is its construction)
            object.__setattr__(self, "workers", len(self.worker_backends.split(",")))

    def validate(self) -> None:
        """The checks across fields, after each field's own (`pcp_core.settings.build`)."""
        if self.min_workers > self.workers:
            raise ConfigError(
                f"{SHEPHERD}.min_workers ({self.min_workers}) must not be more than workers "
                f"({self.workers}): a round could never have enough results"
            )

    def served(self) -> tuple[str, ...]:
        return tuple(entry.strip() for entry in (self.serve or "").split(",") if entry.strip())
