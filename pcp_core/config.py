"""The run configuration: the settings every run has, which the CLI flags and a TOML
file both fill (`pcp_core.config_file`), and one section per plugin that declares
settings of its own (`pcp_core.settings`: `[diloco]` in TOML, `--inner-steps` on the
command line).

Precedence: defaults < `--config FILE.toml` < flags. Every field's help text lives
here or in the plugin's settings, and the CLI builds its options from those fields,
so flags, TOML keys and documentation never drift apart.
"""

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pcp_core.settings import ConfigError, check_value

# The run precisions (`--precision`; what each means: pcp_core.program.precision).
PRECISIONS = ("f32", "bf16")

# Upper bounds of the numeric settings: far above any real run, low enough that a typo
# (an exponent too many) is a one-line error instead of an overflow, a huge allocation or
# a run with no end. Memory is checked separately, against the machine (pcp_core.program.resources).
MAX_SECONDS = 7 * 24 * 3600.0
MAX_STEPS = 10**9
UPPER_BOUNDS: dict[str, float] = {
    "steps": MAX_STEPS,
    "warmup_steps": MAX_STEPS,
    "eval_every": MAX_STEPS,
    "checkpoint_every": MAX_STEPS,
    "steps_per_call": 10**5,
    "eval_batches": 10**5,
    "batch_size": 2**20,
    "n_layer": 10**4,
    "n_head": 2**16,
    "n_embd": 2**20,
    "block_size": 2**20,
    "workers": 10**4,
    "min_workers": 10**4,
    "seed": 2**31 - 1,
    "device": 2**16,
    "worker_timeout": MAX_SECONDS,
    "join_timeout": MAX_SECONDS,
    "round_timeout": MAX_SECONDS,
}


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


def parse_model_settings(text: str | None) -> dict[str, int]:
    """`--model-settings context=8,n_hidden=256` as a dict; the model rejects unknown keys."""
    settings: dict[str, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, _, value = item.partition("=")
        try:
            settings[key.strip()] = int(value)
        except ValueError:
            raise ConfigError(
                f"model_settings: expected KEY=INTEGER, got {item.strip()!r}"
            ) from None
        if not key.strip():
            raise ConfigError(f"model_settings: expected KEY=INTEGER, got {item.strip()!r}")
    return settings


@dataclass
class RunConfig:
    # what to run
    backend: str = _opt("cpu", "Hardware backend (see `pcp plugins`); a shepherd validates on it.")
    algorithm: str = _opt("local", "Training algorithm: `local` (one process) or `diloco`.")
    model: str = _opt("nanogpt", "Model to train.")
    optimizer: str = _opt("adamw", "Inner optimizer, compiled into the device program.")
    dataset: str = _opt("chars", "Dataset source.")
    data: Path | None = _opt(
        None,
        "What --dataset reads: for chars, a UTF-8 text file, or a directory written by "
        "`pcp data prepare` (default: built-in corpus).",
    )
    out: Path | None = _opt(None, "Run directory (default: runs/<timestamp>).")
    target: str | None = _opt(None, "Device architecture to compile for (default: detect).")
    device: int | None = _opt(None, "Index of the device to use (default: first).")
    # model size (None: the model's default)
    model_size: str | None = _opt(
        None,
        "Named model size, e.g. for nanogpt tiny, shakespeare-char, gpt2-small, gpt2-medium "
        "(default: the model's defaults); --n-layer etc. override its values.",
    )
    n_layer: int | None = _opt(None, "Transformer layers.")
    n_head: int | None = _opt(None, "Attention heads.")
    n_embd: int | None = _opt(None, "Embedding width.")
    block_size: int | None = _opt(None, "Context length in tokens.")
    model_settings: str | None = _opt(
        None, "Any model's own size settings as KEY=INT,KEY=INT (e.g. context=8)."
    )
    precision: str = _opt(
        "f32",
        "Matrix products: f32, or bf16 (bf16 inputs, f32 accumulation; weights, optimizer "
        "state and what workers send stay f32).",
    )
    # training
    steps: int = _opt(300, "Inner optimizer steps (per worker for diloco).")
    batch_size: int = _opt(16, "Sequences per step.")
    steps_per_call: int = _opt(10, "Steps the compiled program runs per call (K).")
    lr: float = _opt(3e-3, "Peak learning rate.")
    min_lr: float | None = _opt(
        None, "Learning rate at the end of the cosine decay (default: a tenth of --lr)."
    )
    warmup_steps: int = _opt(20, "Linear warmup steps.")
    weight_decay: float = _opt(0.1, "AdamW decoupled weight decay (matrices only).")
    beta1: float = _opt(0.9, "AdamW beta1.")
    beta2: float = _opt(0.99, "AdamW beta2.")
    eps: float = _opt(1e-8, "AdamW epsilon.")
    grad_clip: float = _opt(1.0, "Global gradient-norm clip (0 disables).")
    seed: int = _opt(0, "Seed for initialisation and data order.")
    eval_every: int = _opt(100, "Evaluate validation loss every N steps (0: only at the end).")
    eval_batches: int = _opt(8, "Validation batches per evaluation.")
    # distributed (diloco)
    workers: int = _opt(2, "Workers to start (one-command diloco form) or wait for.")
    worker_backends: str | None = _opt(
        None, "One-command form: backend of each local worker, e.g. cpu,vulkan (sets --workers)."
    )
    transport: str = _opt("capnp-tcp", "DiLoCo: transport between shepherd and workers.")
    host: str = _opt("127.0.0.1", "Shepherd: address to listen on.")
    port: int | None = _opt(None, "Shepherd: TCP port (default 7433; any free one for train).")
    join_timeout: float = _opt(
        600.0,
        "Shepherd: seconds to wait for workers to join (at the start, or when too few are left).",
    )
    min_workers: int = _opt(
        1, "Shepherd: accepted results a round needs; below that it is retried or waits."
    )
    worker_timeout: float = _opt(
        30.0, "Seconds of silence after which a peer is declared dead (heartbeats every quarter)."
    )
    round_timeout: float | None = _opt(
        None,
        "Shepherd: a round's deadline in seconds (default: 3x recent rounds + --worker-timeout).",
    )
    checkpoint_every: int = _opt(
        1, "Shepherd: write the resumable checkpoint every N rounds (and at the end)."
    )
    serve: str | None = _opt(
        None,
        "Shepherd: what it compiles for, as BACKEND or BACKEND:ARCH entries, e.g. "
        "cpu,cuda:sm_80 (default: any installed backend); other workers are refused.",
    )
    token_file: Path | None = _opt(None, "File holding the shared secret (else $PCP_TOKEN).")
    tls_cert: Path | None = _opt(None, "TLS certificate (PEM) the shepherd presents.")
    tls_key: Path | None = _opt(None, "TLS private key (PEM) for --tls-cert.")
    tls_ca: Path | None = _opt(None, "CA (PEM) local workers use to verify --tls-cert.")
    # watching a run
    status_port: int | None = _opt(
        None,
        "Serve /healthz, /status (JSON) and /metrics (Prometheus) on this port during the "
        "run (0: any free port, logged; default: none). `pcp status HOST:PORT` reads it.",
    )
    status_host: str = _opt(
        "127.0.0.1", "Address the status endpoint listens on (0.0.0.0: every interface)."
    )
    # The settings of the plugins that declare their own (pcp_core.settings), by their
    # registered names: filled by `resolve` (or `with_plugin_settings`), not a flag.
    plugins: dict[str, Any] = field(default_factory=dict, metadata={"help": None})

    def settings(self, plugin: str) -> Any:
        """The settings of plugin `plugin` (its declared dataclass)."""
        try:
            return self.plugins[plugin]
        except KeyError:
            raise ConfigError(
                f"no settings for plugin {plugin!r}: is it installed? (`pcp plugins`)"
            ) from None

    def model_overrides(self) -> dict[str, int | None]:
        flags = {k: getattr(self, k) for k in ("n_layer", "n_head", "n_embd", "block_size")}
        return {**flags, **parse_model_settings(self.model_settings)}

    def local_worker_backends(self) -> list[str]:
        if self.worker_backends:
            return [b.strip() for b in self.worker_backends.split(",")]
        return [self.backend] * self.workers

    def final_lr(self) -> float:
        """The learning rate the cosine decay ends at: `min_lr`, else a tenth of `lr`."""
        return self.lr / 10 if self.min_lr is None else self.min_lr

    def served(self) -> tuple[str, ...]:
        return tuple(entry.strip() for entry in (self.serve or "").split(",") if entry.strip())

    def validate(self) -> "RunConfig":
        if self.serve is not None and not self.served():
            raise ConfigError(
                f"serve: expected BACKEND or BACKEND:ARCH entries, got {self.serve!r}"
            )
        if self.worker_backends is not None:
            backends = [b.strip() for b in self.worker_backends.split(",")]
            if not all(backends):
                raise ConfigError(f"worker_backends: empty name in {self.worker_backends!r}")
            self.workers = len(backends)
        positive = ["steps", "batch_size", "steps_per_call", "eval_batches", "workers"]
        positive += ["min_workers", "checkpoint_every", "worker_timeout"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        parse_model_settings(self.model_settings)
        for name in ("n_layer", "n_head", "n_embd", "block_size", "device"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "device" else 1):
                raise ConfigError(f"{name} must be positive, got {value}")
        self._check_ranges()
        for name, bound in UPPER_BOUNDS.items():
            value = getattr(self, name)
            if value is not None and value > bound:
                raise ConfigError(f"{name} must be at most {bound:,}, got {value:g}")
        if self.seed < 0:
            raise ConfigError(f"seed must not be negative, got {self.seed}")
        if self.algorithm != "local" and self.min_workers > self.workers:
            raise ConfigError(
                f"min_workers ({self.min_workers}) must not be more than workers "
                f"({self.workers}): a round could never have enough results"
            )
        for name in ("port", "status_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 65536:
                raise ConfigError(f"{name} must be in 0..65535, got {value}")
        if self.warmup_steps < 0 or self.eval_every < 0:
            raise ConfigError("warmup_steps and eval_every must not be negative")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"precision must be one of {', '.join(PRECISIONS)}: {self.precision!r}"
            )
        if self.data is not None and not Path(self.data).exists():  # the dataset checks the rest
            raise ConfigError(f"data not found: {self.data}")
        return self

    def _check_ranges(self) -> None:
        """Every float finite, and each optimizer or timeout setting in its range."""
        for item in dataclasses.fields(self):
            check_value(item.name, getattr(self, item.name), {})
        at_least_zero = ["lr", "min_lr", "weight_decay", "grad_clip", "join_timeout"]
        for name in at_least_zero:
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("eps",):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.round_timeout is not None and self.round_timeout <= 0:
            raise ConfigError(f"round_timeout must be positive, got {self.round_timeout}")
        if self.final_lr() > self.lr:
            raise ConfigError(
                f"min_lr must not be above lr, got min_lr {self.min_lr} and lr {self.lr}; "
                "lower --min-lr with --lr"
            )


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig) if f.name != "plugins"}
