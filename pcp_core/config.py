"""The run configuration: one dataclass that the CLI flags and a TOML file both fill.

Precedence: defaults < `--config FILE.toml` < flags. Every field's help text lives
here, and the CLI builds its options from these fields, so flags, TOML keys and
documentation never drift apart.
"""

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from pcp_core.program.precision import PRECISIONS

# Named exponents of --inner-lr-scaling (see RunConfig.inner_lr_scaling).
INNER_LR_SCALINGS = {"sqrt": 0.5, "none": 0.0}
# What a DiLoCo worker does with its inner momentum at a round's start (RunConfig.inner_momentum).
INNER_MOMENTUM = ("reset", "keep")


# Upper bounds of the numeric settings: far above any real run, low enough that a typo
# (an exponent too many) is a one-line error instead of an overflow, a huge allocation or
# a run with no end. Memory is checked separately, against the machine (pcp_core.program.resources).
MAX_SECONDS = 7 * 24 * 3600.0
MAX_STEPS = 10**9
UPPER_BOUNDS: dict[str, float] = {
    "steps": MAX_STEPS,
    "inner_steps": MAX_STEPS,
    "warmup_steps": MAX_STEPS,
    "eval_every": MAX_STEPS,
    "checkpoint_every": MAX_STEPS,
    "inner_warmup_rounds": MAX_STEPS,
    "outer_warmup_rounds": MAX_STEPS,
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


class ConfigError(ValueError):
    """A bad setting: unknown key, wrong type, out-of-range value."""


def inner_lr_exponent(scaling: str) -> float:
    """p of --inner-lr-scaling (the workers' lr is --lr times M^p): a named one or a
    number from 0 to 1; ConfigError for anything else."""
    if scaling in INNER_LR_SCALINGS:
        return INNER_LR_SCALINGS[scaling]
    try:
        exponent = float(scaling)
    except ValueError:
        exponent = -1.0
    if not 0 <= exponent <= 1:
        raise ConfigError(
            f"inner_lr_scaling must be sqrt, none or an exponent from 0 to 1: {scaling!r}"
        )
    return exponent


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
    inner_steps: int = _opt(50, "DiLoCo: inner steps per round (H).")
    outer_optimizer: str = _opt("nesterov", "DiLoCo: outer optimizer run by the shepherd.")
    # Measured against synchronous training at equal tokens (benchmarks/diloco_quality.py,
    # 20 rounds; the trials in benchmarks/results/diloco_trials_2026-11-24*.md): the
    # paper's 0.7 and 0.9 lost 4-12% with two workers. With the workers' inner lr and
    # warm-up below, momentum 0.7 beat 0.5 on 5 of 8 corpus and worker-count pairs and
    # in the worst one (four workers on perl-docs: +2.1% against +3.3%); 0.3 lost 3-6%.
    outer_lr: float = _opt(1.0, "DiLoCo: outer learning rate.")
    outer_momentum: float = _opt(
        0.7, "DiLoCo: outer Nesterov momentum (the paper's 0.9 suits thousands of rounds)."
    )
    # A worker's batch is 1/M of the batch that M workers' averaged step sees, and Adam's
    # progress per step in the noisy regime grows about with the square root of the batch:
    # at √M the workers lost 1-3% to synchronous training where --lr as given lost 4-13%
    # with four workers, but only with a warm-up of several rounds (4: 1.2-3.9%, 6:
    # 1.0-3.3%, a third of the run: 1.2-1.5% with momentum 0.7); with 20 steps of it a
    # larger lr stalled four workers on two of four corpora (+20% and +37%). M^0.75 beat
    # √M in 17 of 20 runs (5 corpora and models, M = 2 and 4, seeds 0 and 1); its worst
    # was +3.0% (village, four workers, seed 1), √M's +4.1% and +3.4% (perl docs and the
    # small model, four workers): benchmarks/results/diloco_trials_2026-11-24c.md.
    inner_lr_scaling: str = _opt(
        "0.75",
        "DiLoCo: the workers' inner learning rate is --lr and --min-lr (those of training "
        "the same tokens a step on one machine) times M^p, M the number of workers: p a "
        "number from 0 to 1, `sqrt` (0.5) or `none` (0: the lr as given, e.g. one tuned "
        "for the workers).",
    )
    inner_warmup_rounds: int = _opt(
        8,
        "DiLoCo: the workers' learning rate warms up over this many rounds of H steps (at "
        "most a third of --steps) where that is longer than --warmup-steps; from scratch a "
        "shorter warm-up to the scaled lr stalls the first rounds. 0: --warmup-steps alone.",
    )
    # A worker's AdamW first moment at the end of a round is the direction of its own
    # last steps, which the outer step has just replaced; carried into the next round it
    # pulls the worker back along its own path. Zeroed (the first steps of a round then
    # also move less while it rebuilds, over about 1/(1 - beta1) steps), the worst
    # four-worker cell of benchmarks/diloco_quality.py went from +2.9% to +1.9% and the
    # mean of all four-worker runs from +1.7% to +1.4%; two workers gave up 0.4 points on
    # average, their means still -3.3% to +0.5% (benchmarks/results/diloco_trials_2026-11-24e.md).
    inner_momentum: str = _opt(
        "reset",
        "DiLoCo: a worker's inner optimizer momentum at the start of a round: reset (zeroed) "
        "or keep (carried over, as in the DiLoCo paper).",
    )
    # Averaging the first rounds instead of a Nesterov step (which moves 1 + momentum
    # times the run's largest pseudo-gradients) gained 0.7-2 points with two workers and
    # the lr as given; with the scaled lr and warm-up above it helped on two corpora and
    # hurt on three (four workers), so it is off.
    outer_warmup_rounds: int = _opt(
        0,
        "DiLoCo: first rounds that take the plain average of the workers' models (outer lr "
        "1, no momentum) before the outer optimizer starts; 2 gained 1-2 points with two "
        "workers under --inner-lr-scaling none, and was mixed with the scaled lr.",
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
        positive += ["inner_steps", "min_workers", "checkpoint_every", "worker_timeout"]
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
        inner_lr_exponent(self.inner_lr_scaling)
        if self.inner_momentum not in INNER_MOMENTUM:
            raise ConfigError(
                f"inner_momentum must be one of {', '.join(INNER_MOMENTUM)}: "
                f"{self.inner_momentum!r}"
            )
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
            value = getattr(self, item.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{item.name} must be a finite number, got {value}")
        at_least_zero = ["lr", "min_lr", "weight_decay", "grad_clip", "join_timeout"]
        at_least_zero += ["inner_warmup_rounds", "outer_warmup_rounds"]
        for name in at_least_zero:
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("eps", "outer_lr"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("beta1", "beta2", "outer_momentum"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.round_timeout is not None and self.round_timeout <= 0:
            raise ConfigError(f"round_timeout must be positive, got {self.round_timeout}")
        if self.final_lr() > self.lr:
            raise ConfigError(
                f"min_lr must not be above lr, got min_lr {self.min_lr} and lr {self.lr}; "
                "lower --min-lr with --lr"
            )


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


def _coerce(name: str, value: Any) -> Any:
    kind = FIELDS[name].type
    if value is None:
        return None
    text = str(kind)
    try:
        if "Path" in text:
            return Path(value)
        if "int" in text and not isinstance(value, bool):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if "float" in text and not isinstance(value, bool):
            return float(value)
        if "str" in text and isinstance(value, str):
            return value
        if "str" in text and isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)  # TOML's `inner_lr_scaling = 0.75`, a number a user writes bare
    except (TypeError, ValueError):
        pass
    raise ConfigError(f"{name}: expected {text.replace('pathlib.', '')}, got {value!r}")


def load_toml(path: Path) -> dict[str, Any]:
    """The settings in a TOML file, with keys checked against the config's fields."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    settings = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in FIELDS:
            raise ConfigError(f"{path}: unknown key {key!r} (see `pcp train --help`)")
        settings[name] = _coerce(name, value)
    return settings


def resolve(
    config_file: Path | None, flags: dict[str, Any], defaults: dict[str, Any] | None = None
) -> RunConfig:
    """Defaults, then the command's defaults, the TOML file, the flags given (not None)."""
    settings = dict(defaults or {})
    settings.update(load_toml(config_file) if config_file else {})
    settings.update({k: _coerce(k, v) for k, v in flags.items() if v is not None})
    return RunConfig(**settings).validate()


def to_toml(config: RunConfig) -> str:
    """The resolved config as TOML (None values omitted), written into every run.

    Written by a TOML library, so any path (backslashes, quotes, newlines) reads back
    as it was.
    """
    settings = {name: getattr(config, name) for name in FIELDS}
    return tomli_w.dumps(
        {k: str(v) if isinstance(v, Path) else v for k, v in settings.items() if v is not None}
    )


def to_dict(config: RunConfig) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(config).items()}
