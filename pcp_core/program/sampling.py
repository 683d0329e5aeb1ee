"""`pcp sample`: continue a prompt with a trained run's model, on the CPU with JAX.

The model comes back from the run's checkpoint (see `pcp_core.program.trained`). Each new
token is one jitted forward pass over a fixed [1, block_size] window, so it compiles
once: the context cropped to its last block_size tokens (as nanoGPT's `generate`),
padded at the end, where the causal mask keeps the padding out of the logits read at
the last real position. Temperature and top-k sampling run in NumPy from one seeded
generator, so a seed gives the same text every time.
"""

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from pcp_core.models import Model, Params
from pcp_core.program import trained

log = structlog.get_logger(__name__)


class SampleError(ValueError):
    """Bad input to `pcp sample`, shown as one line."""


def sample(
    run_dir: Path,
    prompt: str,
    tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    plugins: Any = None,
) -> str:
    """The prompt followed by `tokens` generated tokens, decoded."""
    check_settings(prompt, tokens, temperature, top_k)
    run = trained.load(Path(run_dir), plugins)
    prompt_ids = encode_prompt(run.tokenizer, prompt)
    step, tokenizer = run.metadata.get("step"), run.tokenizer.name
    log.info("sampling", model=run.model.name, step=step, tokenizer=tokenizer)
    new_ids = generate(
        run.model, run.config, run.params, prompt_ids, tokens, temperature, top_k, seed
    )
    return prompt + run.tokenizer.decode(new_ids)


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
    temperature: float,
    top_k: int | None,
    seed: int,
) -> list[int]:
    """`tokens` new token ids after `prompt_ids` (see the module docstring)."""
    import jax

    block = model_config["block_size"]
    cpu = jax.devices("cpu")[0]
    forward = _next_logits(model, model_config)
    rng = np.random.default_rng(seed)
    ids = list(prompt_ids)
    window = np.zeros((1, block), np.int32)
    with jax.default_device(cpu):
        on_cpu = jax.device_put(params, cpu)
        for _ in range(tokens):
            context = ids[-block:]
            window[:] = 0
            window[0, : len(context)] = context
            logits = np.asarray(forward(on_cpu, window, np.int32(len(context) - 1)))
            ids.append(pick(logits, temperature, top_k, rng))
    return ids[len(prompt_ids) :]


def _next_logits(model: Model, model_config: Mapping[str, int]) -> Callable[..., Any]:
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
