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

from pcp_core.settings import MAX_STEPS, ConfigError, check_value
from pcp_core.shepherd_settings import DEFAULT_PORT as DEFAULT_PORT
from pcp_core.shepherd_settings import SHEPHERD, ShepherdSettings

# The run precisions (`--precision`; what each means: pcp_core.program.precision).
PRECISIONS = ("f32", "bf16")
# The learning-rate schedules after the warmup (`--lr-schedule`); as pcp_core.optimizers
# has them (imported here would load numpy for `pcp --help`)
SCHEDULES = ("cosine", "linear", "constant", "wsd")

# Upper bounds of the run config's numeric settings (why: pcp_core.settings.MAX_STEPS).
UPPER_BOUNDS: dict[str, float] = {
    "steps": MAX_STEPS,
    "warmup_steps": MAX_STEPS,
    "eval_every": MAX_STEPS,
    "save_every": MAX_STEPS,
    "keep": MAX_STEPS,
    "steps_per_call": 10**5,
    "eval_batches": 10**5,
    "batch_size": 2**20,
    "grad_accum": 2**16,
    "n_layer": 10**4,
    "n_head": 2**16,
    "n_embd": 2**20,
    "block_size": 2**20,
    "seed": 2**31 - 1,
    "device": 2**16,
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
    algorithm: str = _opt(
        "local",
        "Training algorithm: `local` (one process), `diloco`, `sparseloco` (pcp-sparseloco), "
        "or any an installed plugin registers (`pcp plugins`).",
    )
    model: str = _opt("nanogpt", "Model to train.")
    optimizer: str = _opt("adamw", "Inner optimizer, compiled into the device program.")
    dataset: str = _opt("chars", "Dataset source.")
    data: Path | None = _opt(
        None,
        "What --dataset reads: for chars, a UTF-8 text file, or a directory written by "
        "`pcp data prepare` (default: built-in corpus).",
    )
    init_from: Path | None = _opt(
        None,
        "Start from a pretrained GPT-2: a Hugging Face model folder (config.json and "
        "model.safetensors or pytorch_model.bin, as save_pretrained writes and the hub "
        "serves). It sets the model's shape; --data must be tokenized with its tokenizer "
        "(`pcp data prepare INPUT --tokenizer FOLDER -o DATA`).",
    )
    out: Path | None = _opt(None, "Run directory (default: runs/<timestamp>).")
    target: str | None = _opt(None, "Device architecture to compile for (default: detect).")
    device: int | None = _opt(None, "Index of the device to use (default: first).")
    # model size (None: the model's default)
    model_size: str | None = _opt(
        None,
        "Named model size, e.g. for nanogpt tiny, shakespeare-char, gpt2-small, gpt2-medium, "
        "gpt2-large, gpt2-xl (default: the model's defaults); --n-layer etc. override its values.",
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
    remat: str = _opt(
        "none",
        "Activation rematerialisation: none, or blocks (each transformer block's activations "
        "recomputed in the backward pass, not kept: less memory, about a third more compute).",
    )
    # training
    steps: int = _opt(300, "Inner optimizer steps (per worker for diloco).")
    batch_size: int = _opt(16, "Sequences per micro-batch: a step takes --grad-accum of them.")
    grad_accum: int = _opt(
        1,
        "Gradient accumulation: a step's gradient is the mean over N micro-batches of "
        "--batch-size, computed one after another (the activations of one micro-batch in "
        "memory), so a step takes --batch-size × N sequences.",
    )
    steps_per_call: int = _opt(10, "Steps the compiled program runs per call (K).")
    lr: float = _opt(3e-3, "Peak learning rate.")
    min_lr: float | None = _opt(
        None, "Learning rate at the end of the decay (default: a tenth of --lr)."
    )
    warmup_steps: int = _opt(20, "Linear warmup steps.")
    lr_schedule: str = _opt(
        "cosine",
        "After the warmup: cosine (decay to --min-lr at the end), linear (the same, in a "
        "straight line), constant (--lr throughout), or wsd (warmup-stable-decay: --lr, "
        "then a linear decay to --min-lr over the last --decay-fraction of the steps).",
    )
    decay_fraction: float = _opt(0.2, "wsd: the share of the steps the final decay takes.")
    grad_clip: float = _opt(1.0, "Global gradient-norm clip (0 disables).")
    seed: int = _opt(0, "Seed for initialisation and data order.")
    eval_every: int = _opt(100, "Evaluate validation loss every N steps (0: only at the end).")
    eval_batches: int = _opt(8, "Validation batches per evaluation.")
    save_every: int = _opt(
        0,
        "Besides the rolling checkpoint.safetensors, keep one every N steps, as "
        "step-N.safetensors in the run's checkpoints folder (0: none).",
    )
    keep: int = _opt(0, "With --save-every: keep only the newest N of those (0: all).")
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

    @property
    def shepherd(self) -> ShepherdSettings:
        """The `[shepherd]` section: what a distributed run's shepherd and workers use."""
        return self.settings(SHEPHERD)

    def local_worker_backends(self) -> list[str]:
        """The backends of the workers the one-command form starts (`--worker-backends`,
        else `--workers` times `--backend`)."""
        shepherd = self.shepherd
        if shepherd.worker_backends:
            return [b.strip() for b in shepherd.worker_backends.split(",")]
        return [self.backend] * shepherd.workers

    @property
    def step_batch(self) -> int:
        """Sequences a step takes: --batch-size micro-batches, --grad-accum of them."""
        return self.batch_size * self.grad_accum

    def final_lr(self) -> float:
        """The learning rate the cosine decay ends at: `min_lr`, else a tenth of `lr`."""
        return self.lr / 10 if self.min_lr is None else self.min_lr

    def validate(self) -> "RunConfig":
        for name in ("steps", "batch_size", "grad_accum", "steps_per_call", "eval_batches"):
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
        if self.status_port is not None and not 0 <= self.status_port < 65536:
            raise ConfigError(f"status_port must be in 0..65535, got {self.status_port}")
        for name in ("warmup_steps", "eval_every", "save_every", "keep"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.lr_schedule not in SCHEDULES:
            raise ConfigError(
                f"lr_schedule must be one of {', '.join(SCHEDULES)}: {self.lr_schedule!r}"
            )
        if not 0 < self.decay_fraction <= 1:
            raise ConfigError(f"decay_fraction must be in (0, 1], got {self.decay_fraction}")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"precision must be one of {', '.join(PRECISIONS)}: {self.precision!r}"
            )
        if self.data is not None and not Path(self.data).exists():  # the dataset checks the rest
            raise ConfigError(f"data not found: {self.data}")
        return self

    def _check_ranges(self) -> None:
        """Every float finite, and each schedule setting in its range."""
        for item in dataclasses.fields(self):
            check_value(item.name, getattr(self, item.name), {})
        for name in ("lr", "min_lr", "grad_clip"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.final_lr() > self.lr:
            raise ConfigError(
                f"min_lr must not be above lr, got min_lr {self.min_lr} and lr {self.lr}; "
                "lower --min-lr with --lr"
            )


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig) if f.name != "plugins"}
