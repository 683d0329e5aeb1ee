"""What every training role shares: resolving plugins, building and compiling the program."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from pcp_core.backends import Backend
from pcp_core.config import ConfigError, RunConfig
from pcp_core.config_file import to_dict
from pcp_core.data.text import Corpus
from pcp_core.models import Model
from pcp_core.optimizers import InnerSettings, schedule_values
from pcp_core.program import checkpoint, export_cache, huggingface
from pcp_core.program.build import TrainProgram, build_eval_program, build_train_program
from pcp_core.program.evaluation import Evaluator
from pcp_core.program.footprint import Footprint, estimate, human_count, parameter_shapes
from pcp_core.program.resources import require_memory

log = structlog.get_logger(__name__)

# `--remat`'s choices, in the order of the values of a model's `remat` setting (nanogpt's:
# 1 recomputes each transformer block in the backward pass). A model offers
# rematerialisation by having that setting.
REMATS = ("none", "blocks")


@dataclass
class TrainingSetup:
    config: RunConfig
    model: Model
    model_config: dict[str, int]
    corpus: Corpus  # a text corpus (CharCorpus) or a prepared dataset (PreparedDataset)
    program: TrainProgram
    evaluator: Evaluator  # validation on the run's own backend (`--backend`)
    checkpoint_error: str | None = None  # why the latest checkpoint was not written
    pretrained: dict[str, np.ndarray] | None = None  # --init-from's, in the model's order

    def initial_params(self) -> list[np.ndarray]:
        if self.pretrained is not None:
            return [array.copy() for array in self.pretrained.values()]
        return list(self.model.init(self.model_config, self.config.seed).values())

    def param_names(self) -> list[str]:
        return [s.name for s in self.program.param_specs]

    def tokens_per_step(self) -> int:
        return self.config.step_batch * self.model_config["block_size"]

    def footprint(self) -> Footprint:
        return footprint_of(self.config, self.model_config, self.program)

    def validation_loss(self, params: list[np.ndarray]) -> float:
        """Mean loss over a fixed set of validation batches (the same every time),
        computed by the compiled eval program on the run's backend."""
        x, y = self.corpus.batches(
            "validation",
            self.config.eval_batches,
            self.config.batch_size,
            self.model_config["block_size"],
            stream=(self.config.seed, 0xE7A1),
        )
        return self.evaluator.loss(params, x, y)

    def scoring_losses(self, params: list[np.ndarray], round_index: int) -> np.ndarray:
        """The loss of each of `eval_batches` training batches drawn anew each round, so
        no worker can know them in advance, by the eval program: what a shepherd scores
        each result by (`pcp_core.shepherd.accountability`)."""
        x, y = self.corpus.batches(
            "train",
            self.config.eval_batches,
            self.config.batch_size,
            self.model_config["block_size"],
            stream=(self.config.seed, 0x5C0E, round_index),
        )
        return self.evaluator.losses(params, x, y)

    def evaluates_after(self, step: int, stride: int) -> bool:
        """Whether to evaluate after a call or round of `stride` steps that ended at `step`:
        at the end of the run, and each time a multiple of `eval_every` was passed."""
        every = self.config.eval_every
        return step >= self.config.steps or bool(every and step % every < stride)

    def saves_after(self, step: int, stride: int) -> bool:
        """Whether a call or round of `stride` steps that ended at `step` passed a
        multiple of `--save-every`: its checkpoint is kept (`save_checkpoint`)."""
        every = self.config.save_every
        return bool(every) and step // every > (step - stride) // every

    def resume_from(
        self, run_dir: Path, params: list[np.ndarray], algorithm: str
    ) -> tuple[dict[str, str], dict[str, np.ndarray]]:
        """Load the run directory's last intact checkpoint into `params`: its metadata
        (what `algorithm` saved to resume from is under its name, as JSON) and every
        tensor in it. CheckpointError where it is not from a run of `algorithm`."""
        tensors, metadata = checkpoint.load_latest(run_dir / "checkpoint.safetensors")
        if algorithm not in metadata:
            raise checkpoint.CheckpointError(
                f"{run_dir}: the checkpoint is not from a {algorithm} run, it cannot be resumed"
            )
        for name, array in zip(self.param_names(), params, strict=True):
            array[...] = tensors[name]
        return metadata, tensors

    def save_checkpoint(
        self,
        run_dir: Path,
        params: list[np.ndarray],
        step: int,
        extra: dict[str, np.ndarray] | None = None,
        resume: dict[str, Any] | None = None,
        kept: bool = False,
    ) -> None:
        """The parameters by name (+ `extra` tensors) and what is needed to use them, plus
        what an algorithm needs to resume from it (`resume`); `kept` (`saves_after`): also
        as RUN_DIR/checkpoints/step-N.safetensors, the newest `--keep` of those kept."""
        tensors = dict(zip(self.param_names(), params, strict=True)) | (extra or {})
        metadata = {
            "step": step,
            "model": self.config.model,
            "model_config": self.model_config,
            "tokenizer": self.corpus.tokenizer.to_json(),  # what `pcp sample` reads
            **(resume or {}),
        }
        vocabulary = getattr(self.corpus, "vocabulary", None)
        if vocabulary is not None:  # for readers from before the tokenizer was stored
            metadata["vocabulary"] = vocabulary
        try:
            checkpoint.save(run_dir / "checkpoint.safetensors", tensors, metadata)
        except checkpoint.CheckpointWriteError as error:
            # A full disk may be freed while the run goes on: keep training, try again at
            # the next checkpoint; the run's end says whether the last one was written.
            self.checkpoint_error = str(error)
            log.error(
                "checkpoint not written; the previous one is kept, and training goes on",
                step=step,
                error=str(error),
            )
            return
        self.checkpoint_error = None
        if kept:
            checkpoint.keep_copy(run_dir / "checkpoint.safetensors", step, self.config.keep)

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
            "memory_estimate": self.footprint().to_dict(),
            "checkpoint_error": self.checkpoint_error,
            "config": to_dict(self.config),
        }


def inner_settings(config: RunConfig) -> InnerSettings:
    """The run's schedule and clip, and the inner optimizer's own settings (`[adamw]`)."""
    return InnerSettings(
        lr=config.lr,
        min_lr=config.final_lr(),
        warmup_steps=config.warmup_steps,
        total_steps=config.steps,
        schedule=config.lr_schedule,
        decay_steps=round(config.decay_fraction * config.steps),
        grad_clip=config.grad_clip,
        own=config.plugins.get(config.optimizer),
    )


def prepare(
    config: RunConfig,
    plugins: Any,
    trainers: list[str] | None = None,
    shepherd: bool = False,
) -> TrainingSetup:
    """Load the data, size the model to its vocabulary, check that the run fits this
    machine's memory (`trainers`: the backends of the training processes started here,
    default the run's own; `shepherd`: this process holds a distributed run's model
    copies) and export the train program."""
    model: Model = plugins.model(config.model)
    optimizer = plugins.optimizer(config.optimizer)
    if getattr(optimizer, "role", None) != "inner":
        raise ValueError(f"optimizer {config.optimizer!r} is not an inner optimizer")
    remat = remat_setting(model, config)
    corpus = plugins.dataset(config.dataset).load(config.data)
    pretrained = huggingface.read(config.init_from) if config.init_from else None
    if pretrained is None:
        overrides = {**config.model_overrides(), "vocab_size": corpus.vocab_size}
    else:
        overrides = pretrained_settings(config, pretrained, corpus)
    preset = None if pretrained else config.model_size
    model_config = model.config({**overrides, **remat}, preset=preset)
    if "block_size" in model_config:
        corpus.check_block_size(model_config["block_size"])
    initial = None
    if pretrained is not None:
        initial = huggingface.fitted(pretrained, parameter_shapes(model, model_config))
    footprint = estimate(
        parameter_shapes(model, model_config).values(), model_config, config.batch_size
    )
    evaluation_bytes = (
        8 * config.eval_batches * config.batch_size * model_config.get("block_size", 1)
    )
    trainer_names = [config.backend] if trainers is None else trainers
    backends = [plugins.backend(name) for name in trainer_names]
    require_memory(footprint, backends, shepherd, evaluation_bytes)
    settings = inner_settings(config)
    identity = export_cache.identity(model, optimizer, model_config, settings)
    program = build_train_program(
        model,
        model_config,
        optimizer.build(settings),
        steps_per_call=config.steps_per_call,
        batch_size=config.step_batch,
        seed=config.seed,
        precision=config.precision,
        identity=identity,
        schedule=schedule_values(settings),
        micro_batches=config.grad_accum,
    )
    log_model(config, model_config, program)

    def build_evaluation() -> TrainProgram:
        return build_eval_program(
            model,
            model_config,
            config.eval_batches,
            config.batch_size,
            seed=config.seed,
            precision=config.precision,
            identity=identity,
        )

    evaluator = Evaluator(build_evaluation, *resolve_backend(config, plugins), config.device)
    return TrainingSetup(
        config, model, model_config, corpus, program, evaluator, pretrained=initial
    )


def pretrained_settings(
    config: RunConfig, pretrained: huggingface.Pretrained, corpus: Corpus
) -> dict[str, int | None]:
    """The model's settings from --init-from's checkpoint, and --block-size up to its
    length; ConfigError where the flags or the data's tokens disagree with it."""
    shape = pretrained.model_config
    for key in ("n_layer", "n_head", "n_embd"):
        given = config.model_overrides().get(key)
        if given is not None and given != shape[key]:
            raise ConfigError(
                f"--init-from's model has {key} {shape[key]}; leave --{key.replace('_', '-')} out"
            )
    if config.model_size:
        raise ConfigError("--init-from sets the model's size; leave --model-size out")
    block_size = config.block_size or shape["block_size"]
    if block_size > shape["block_size"]:
        raise ConfigError(
            f"--block-size {block_size} is longer than the {shape['block_size']} positions "
            "of --init-from's model"
        )
    own = pretrained.tokenizer
    same = own is None or own.to_json() == corpus.tokenizer.to_json()
    if corpus.vocab_size > shape["vocab_size"] or not same:
        raise ConfigError(
            f"--data is not in --init-from's tokens: tokenize it with the model's tokenizer "
            f"(`pcp data prepare INPUT --tokenizer {pretrained.source} -o DATA`)"
        )
    return {**shape, "block_size": block_size}


def remat_setting(model: Model, config: RunConfig) -> dict[str, int]:
    """`--remat` as the model's `remat` setting ({} for none); ValueError for an unknown
    choice or a model that has no such setting."""
    if config.remat not in REMATS:
        raise ValueError(f"remat must be one of {', '.join(REMATS)}: {config.remat!r}")
    if config.remat == "none":
        return {}
    if "remat" not in model.defaults:
        raise ValueError(f"model {config.model!r} has no rematerialisation: use --remat none")
    return {"remat": REMATS.index(config.remat)}


def footprint_of(
    config: RunConfig, model_config: dict[str, int], program: TrainProgram
) -> Footprint:
    """The parameter count and estimated memory of a training step (pcp_core.program.footprint)."""
    return estimate(
        [spec.shape for spec in program.param_specs],
        model_config,
        config.batch_size,
        optimizer_bytes=sum(spec.nbytes for spec in program.opt_specs),
    )


def log_model(config: RunConfig, model_config: dict[str, int], program: TrainProgram) -> None:
    """Say how big the model is and how much memory training it may take, before it starts."""
    footprint = footprint_of(config, model_config, program)
    log.info(
        "model",
        name=config.model,
        **({"size": config.model_size} if config.model_size else {}),
        parameters=human_count(footprint.parameters),
        estimated_memory=footprint.describe_memory(),
    )


def resolve_backend(config: RunConfig, plugins: Any) -> tuple[Backend, str]:
    backend: Backend = plugins.backend(config.backend)
    backend.check_precision(config.precision)
    return backend, backend.resolve_arch(config.target, config.device)
