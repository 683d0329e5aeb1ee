"""What every training role shares: resolving plugins, building and compiling the program."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pcp_core import checkpoint
from pcp_core.backends import Backend
from pcp_core.config import RunConfig, to_dict
from pcp_core.data import CharCorpus
from pcp_core.models import Model
from pcp_core.optimizers import InnerSettings
from pcp_core.program import TrainProgram, build_train_program


@dataclass
class TrainingSetup:
    config: RunConfig
    model: Model
    model_config: dict[str, int]
    corpus: CharCorpus
    program: TrainProgram

    def initial_params(self) -> list[np.ndarray]:
        return list(self.model.init(self.model_config, self.config.seed).values())

    def param_names(self) -> list[str]:
        return [s.name for s in self.program.param_specs]

    def tokens_per_step(self) -> int:
        return self.config.batch_size * self.model_config["block_size"]

    def validation_loss(self, params: list[np.ndarray]) -> float:
        """Mean loss over a fixed set of validation batches (the same every time)."""
        x, y = self.corpus.batches(
            "validation",
            self.config.eval_batches,
            self.config.batch_size,
            self.model_config["block_size"],
            stream=(self.config.seed, 0xE7A1),
        )
        return self.program.eval_loss(params, x, y)

    def evaluates_after(self, step: int, stride: int) -> bool:
        """Whether to evaluate after a call or round of `stride` steps that ended at `step`:
        at the end of the run, and each time a multiple of `eval_every` was passed."""
        every = self.config.eval_every
        return step >= self.config.steps or bool(every and step % every < stride)

    def save_checkpoint(
        self,
        run_dir: Path,
        params: list[np.ndarray],
        step: int,
        extra: dict[str, np.ndarray] | None = None,
        resume: dict[str, Any] | None = None,
    ) -> None:
        """The parameters by name (+ `extra` tensors) and what is needed to use them, plus
        what an algorithm needs to resume from it (`resume`)."""
        tensors = dict(zip(self.param_names(), params, strict=True)) | (extra or {})
        metadata = {
            "step": step,
            "model": self.config.model,
            "model_config": self.model_config,
            "vocabulary": self.corpus.vocabulary,
            **(resume or {}),
        }
        checkpoint.save(run_dir / "checkpoint.safetensors", tensors, metadata)

    def summary(
        self,
        train_loss: float,
        val_loss: float | None,
        tokens: int,
        tokens_per_s: float,
        wall_time_s: float,
    ) -> dict[str, Any]:
        """The summary.json fields every algorithm writes; algorithms add their own."""
        return {
            "final_train_loss": train_loss,
            "final_val_loss": val_loss,
            "unigram_entropy": self.corpus.unigram_entropy(),
            "tokens": tokens,
            "tokens_per_s": tokens_per_s,
            "wall_time_s": wall_time_s,
            "backend": self.config.backend,
            "parameters": self.program.parameter_count,
            "config": to_dict(self.config),
        }


def inner_settings(config: RunConfig) -> InnerSettings:
    return InnerSettings(
        lr=config.lr,
        min_lr=config.final_lr(),
        warmup_steps=config.warmup_steps,
        total_steps=config.steps,
        weight_decay=config.weight_decay,
        beta1=config.beta1,
        beta2=config.beta2,
        eps=config.eps,
        grad_clip=config.grad_clip,
    )


def prepare(config: RunConfig, plugins: Any) -> TrainingSetup:
    """Load the data, size the model to its vocabulary and export the train program."""
    model: Model = plugins.model(config.model)
    optimizer = plugins.optimizer(config.optimizer)
    if getattr(optimizer, "role", None) != "inner":
        raise ValueError(f"optimizer {config.optimizer!r} is not an inner optimizer")
    corpus = plugins.dataset(config.dataset).load(config.data)
    model_config = model.config({**config.model_overrides(), "vocab_size": corpus.vocab_size})
    if "block_size" in model_config:
        corpus.check_block_size(model_config["block_size"])
    program = build_train_program(
        model,
        model_config,
        optimizer.build(inner_settings(config)),
        steps_per_call=config.steps_per_call,
        batch_size=config.batch_size,
        seed=config.seed,
        precision=config.precision,
    )
    return TrainingSetup(config, model, model_config, corpus, program)


def resolve_backend(config: RunConfig, plugins: Any) -> tuple[Backend, str]:
    backend: Backend = plugins.backend(config.backend)
    backend.check_precision(config.precision)
    return backend, backend.resolve_arch(config.target, config.device)
