"""What every training role shares: resolving plugins, building and compiling the program."""

from dataclasses import dataclass
from typing import Any

import numpy as np

from pcp_core.backends import Backend
from pcp_core.config import RunConfig
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


def inner_settings(config: RunConfig) -> InnerSettings:
    return InnerSettings(
        lr=config.lr,
        min_lr=config.min_lr,
        warmup_steps=config.warmup_steps,
        total_steps=config.steps,
        weight_decay=config.weight_decay,
        beta1=config.beta1,
        beta2=config.beta2,
        eps=config.eps,
        grad_clip=config.grad_clip,
    )


def prepare(config: RunConfig, plugins: Any, corpus: CharCorpus | None = None) -> TrainingSetup:
    """Load the data, size the model to its vocabulary and export the train program."""
    model: Model = plugins.model(config.model)
    optimizer = plugins.optimizer(config.optimizer)
    if getattr(optimizer, "role", None) != "inner":
        raise ValueError(f"optimizer {config.optimizer!r} is not an inner optimizer")
    if corpus is None:
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
    )
    return TrainingSetup(config, model, model_config, corpus, program)


def resolve_backend(config: RunConfig, plugins: Any) -> tuple[Backend, str]:
    backend: Backend = plugins.backend(config.backend)
    return backend, backend.resolve_arch(config.target)
