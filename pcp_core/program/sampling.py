"""`pcp sample`: continue a prompt with a trained run's model, on the CPU with JAX, or on
a backend through a key/value cache (`pcp_core.program.decoding`).

The model comes back from the run's checkpoint (see `pcp_core.program.trained`). Each new
token is one jitted forward pass over a fixed [1, block_size] window, so it compiles
once: the context cropped to its last block_size tokens (as nanoGPT's `generate`),
padded at the end, where the causal mask keeps the padding out of the logits read at
the last real position. Temperature and top-k sampling run in NumPy from one seeded
generator, so a seed gives the same text every time, and the same text with the cache.
A prompt longer than the block is refused: cropped, it would not be the prompt.
"""

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog

from pcp_core.models import Model, Params
from pcp_core.program import decoding, trained

if TYPE_CHECKING:
    import jax

log = structlog.get_logger(__name__)


class SampleError(ValueError):
    """Bad input to `pcp sample`, shown as one line."""


@dataclass(frozen=True)
class Sampled:
    text: str  # the prompt and its continuation
    generated: decoding.Generated
    runner: str  # what computed the logits


def sample(
    run_dir: Path,
    prompt: str,
    tokens: int,
    plugins: trained.ModelLookup,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    open_decoder: Callable[[trained.TrainedModel], decoding.Decoder] | None = None,
    runner: str = "jax cpu",
) -> Sampled:
    """The prompt followed by `tokens` generated tokens. With `open_decoder` (a
    backend's, see `pcp_core.iree.inference.decoder_for`), through its key/value cache
    (`pcp_core.program.decoding`), named `runner`; the same text for the same seed."""
    check_settings(prompt, tokens, temperature, top_k)
    run = trained.load(Path(run_dir), plugins)
    prompt_ids = encode_prompt(run.tokenizer, prompt)
    block = run.config["block_size"]
    if len(prompt_ids) > block:
        raise SampleError(
            f"--prompt is {len(prompt_ids)} tokens, more than the model's block size ({block})"
        )
    step, tokenizer = run.metadata.get("step"), run.tokenizer.name
    log.info("sampling", model=run.model.name, step=step, tokenizer=tokenizer, runner=runner)
    rng = np.random.default_rng(seed)

    def choose(logits: np.ndarray) -> int:
        return pick(logits, temperature, top_k, rng)

    if open_decoder is None:
        generated = generate(run.model, run.config, run.params, prompt_ids, tokens, choose)
    else:
        decoder = open_decoder(run)
        generated = decoding.generate(decoder, block, prompt_ids, tokens, choose)
    text = prompt + run.tokenizer.decode(generated.ids)
    return Sampled(text, generated, runner)


def check_settings(prompt: str, tokens: int, temperature: float, top_k: int | None) -> None:
    if not prompt:
        raise SampleError("--prompt is empty; give at least one character to continue")
    if tokens <= 0:
        raise SampleError(f"--tokens must be positive, got {tokens}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise SampleError(f"--temperature must be a positive number, got {temperature}")
    if top_k is not None and top_k < 1:
        raise SampleError(f"--top-k must be at least 1, got {top_k}")


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    try:
        ids = tokenizer.encode(prompt)
    except (ValueError, KeyError) as error:
        raise SampleError(f"--prompt: {error}") from None
    return [int(i) for i in np.asarray(ids).reshape(-1)]


def generate(
    model: Model,
    model_config: Mapping[str, int],
    params: Params,
    prompt_ids: list[int],
    tokens: int,
    choose: Callable[[np.ndarray], int],
) -> decoding.Generated:
    """`tokens` new token ids after `prompt_ids`, each drawn by `choose` from its logits
    (see the module docstring)."""
    import jax

    block = model_config["block_size"]
    cpu = jax.devices("cpu")[0]
    ids = list(prompt_ids)
    window = np.zeros((1, block), np.int32)
    with jax.default_device(cpu):
        on_cpu = jax.device_put(params, cpu)
        # compiled now, so that generating times no compiling
        forward = _next_logits(model, model_config).lower(on_cpu, window, np.int32(0)).compile()
        started, first = time.perf_counter(), 0.0
        for _ in range(tokens):
            context = ids[-block:]
            window[:] = 0
            window[0, : len(context)] = context
            logits = np.asarray(forward(on_cpu, window, np.int32(len(context) - 1)))
            ids.append(choose(logits))
            first = first or time.perf_counter() - started
    elapsed = time.perf_counter() - started
    return decoding.Generated(ids[len(prompt_ids) :], elapsed, first)


def _next_logits(model: Model, model_config: Mapping[str, int]) -> "jax.stages.Wrapped":
    """A jitted (params, window [1, block], position) -> logits [vocab] at `position`."""
    import jax

    logits_of = model.logits
    if logits_of is None:
        raise SampleError(f"model {model.name!r} has no logits function, so it cannot sample")

    @jax.jit
    def next_logits(params: Params, window: Any, position: Any) -> Any:
        logits = logits_of(model_config, params, window)
        return jax.lax.dynamic_index_in_dim(logits[0], position, keepdims=False)

    return next_logits


def pick(
    logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator
) -> int:
    """A token drawn from softmax(logits / temperature), over the `top_k` likeliest only."""
    scaled = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < scaled.size:
        cutoff = np.partition(scaled, -top_k)[-top_k]
        scaled = np.where(scaled < cutoff, -np.inf, scaled)
    weights = np.exp(scaled - scaled.max())
    return int(rng.choice(scaled.size, p=weights / weights.sum()))
