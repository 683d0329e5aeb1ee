"""Sampling with a key/value cache: the context once, then one position a token.

Two step functions of the model's `decode`, each `(params..., cache, tokens, start,
last) -> (logits [vocab], cache)` in float32: `prefill` takes a whole block window
(the context padded at the end, as `pcp_core.program.sampling` pads it) and `decode`
one token at position `start`. The cache lives with the runner between calls, so a
token past the context costs one position. Once the sequence fills the block, the
context slides (the last block_size tokens, as the uncached sampler crops it) and each
token is a `prefill` of the new window: the same logits, so a seed gives the same text.

The functions are exported with static shapes for IREE (`pcp export --format iree`,
`pcp sample --backend`); `JaxDecoder` runs them jitted in jax (backends that are not
IREE's, and the tests' reference).
"""

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pcp_core.models import Model, Params
from pcp_core.program.build import without_locations
from pcp_core.program.footprint import parameter_shapes

STEPS = ("prefill", "decode")


class DecodeError(ValueError):
    """A model or setting the cached sampler cannot use, shown as one line."""


class Decoder(Protocol):
    """Runs the two step functions, keeping the cache between calls."""

    def prefill(self, window: np.ndarray, last: int) -> np.ndarray: ...

    def decode(self, token: int, position: int) -> np.ndarray: ...


@dataclass(frozen=True)
class Generated:
    ids: list[int]
    seconds: float  # generating them
    first_seconds: float  # generating the first (reading the whole prompt)

    @property
    def tokens_per_s(self) -> float:
        return len(self.ids) / self.seconds if self.seconds > 0 else float("inf")

    @property
    def later_tokens_per_s(self) -> float:
        """After the first token: the rate a long continuation tends to."""
        later = self.seconds - self.first_seconds
        return (len(self.ids) - 1) / later if later > 0 else float("inf")


def generate(
    decoder: Decoder,
    block: int,
    prompt_ids: list[int],
    tokens: int,
    pick: Callable[[np.ndarray], int],
) -> Generated:
    """`tokens` new ids after `prompt_ids`, each drawn by `pick` from its logits."""
    ids, cached = list(prompt_ids), 0  # positions the cache holds for `ids`
    window = np.zeros((1, block), np.int32)
    started, first = time.perf_counter(), 0.0
    for _ in range(tokens):
        if 0 < cached < block:
            logits = decoder.decode(ids[-1], cached)
            cached += 1
        else:
            context = ids[-block:]
            window[:] = 0
            window[0, : len(context)] = context
            logits = decoder.prefill(window, len(context) - 1)
            cached = len(context)
        ids.append(pick(np.asarray(logits)))
        first = first or time.perf_counter() - started
    return Generated(ids[len(prompt_ids) :], time.perf_counter() - started, first)


def check_model(model: Model) -> tuple[Callable[..., Any], Callable[..., tuple[int, ...]]]:
    if model.decode is None or model.cache_shape is None:
        raise DecodeError(
            f"model {model.name!r} has no decode function (a key/value cache), so it "
            "samples only without --backend"
        )
    return model.decode, model.cache_shape


def step_function(model: Model, config: Mapping[str, int], name: str) -> Callable[..., Any]:
    """`name(*params, cache, tokens, start, last) -> (logits [vocab], cache)`, the
    model's `decode` over flat arguments (params in the model's order) of one sequence;
    named, as jax names the exported module after it (`jit_prefill`, `jit_decode`)."""
    decode_of, _ = check_model(model)
    names = list(parameter_shapes(model, config))

    def step(*args: Any) -> Any:
        *params, cache, tokens, start, last = args
        named = dict(zip(names, params, strict=True))
        logits, cache = decode_of(config, named, cache, tokens, start, last)
        return logits[0], cache

    step.__name__ = step.__qualname__ = name
    return step


def arguments(model: Model, config: Mapping[str, int], step: str) -> list[Any]:
    """The abstract arguments of `step`: params, cache, tokens [1, time], start, last."""
    import jax
    import jax.numpy as jnp

    _, cache_shape = check_model(model)
    time_ = config["block_size"] if step == "prefill" else 1
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    return [
        *(jax.ShapeDtypeStruct(s, jnp.float32) for s in parameter_shapes(model, config).values()),
        jax.ShapeDtypeStruct(cache_shape(config, 1), jnp.float32),
        jax.ShapeDtypeStruct((1, time_), jnp.int32),
        scalar,
        scalar,
    ]


def stablehlo(model: Model, config: Mapping[str, int]) -> dict[str, str]:
    """Each step function as StableHLO text (module `jit_<step>`, function `main`), with
    f32 products at full precision, as the training programs. The cache is donated (its
    result may reuse its buffer): GPT-2 small's decode on the CPU took 0.18 s rather than
    0.21 a token with IREE, as XLA writes in place (0.05 rather than 0.09)."""
    import jax

    texts = {}
    donated = (len(parameter_shapes(model, config)),)
    with jax.default_matmul_precision("highest"):
        for step in STEPS:
            function = jax.jit(step_function(model, config, step), donate_argnums=donated)
            exported = jax.export.export(function)(*arguments(model, config, step))
            texts[step] = without_locations(exported.mlir_module())
    return texts


class StepRunner:
    """A `Decoder` over compiled step functions that keep the params and the cache where
    they run: `steps` by name, called as `(*params, cache, tokens, start, last)`."""

    def __init__(self, steps: Mapping[str, Callable[..., Any]], params: list[Any], cache: Any):
        self._steps, self._params, self._cache = steps, params, cache

    def _call(self, step: str, tokens: np.ndarray, start: int, last: int) -> np.ndarray:
        args = (*self._params, self._cache, tokens, np.int32(start), np.int32(last))
        logits, self._cache = self._steps[step](*args)
        return self.to_host(logits)

    def to_host(self, logits: Any) -> np.ndarray:
        return np.asarray(logits)

    def prefill(self, window: np.ndarray, last: int) -> np.ndarray:
        return self._call("prefill", window, 0, last)

    def decode(self, token: int, position: int) -> np.ndarray:
        return self._call("decode", np.asarray([[token]], np.int32), position, 0)


class JaxDecoder(StepRunner):
    """The step functions compiled by jax for `device` (default: its first)."""

    def __init__(self, model: Model, config: Mapping[str, int], params: Params, device: Any = None):
        import jax
        import jax.numpy as jnp

        _, cache_shape = check_model(model)
        device = device or jax.devices()[0]
        on_device = [jax.device_put(np.asarray(v, np.float32), device) for v in params.values()]
        cache = jax.device_put(jnp.zeros(cache_shape(config, 1), jnp.float32), device)
        steps = {}
        with jax.default_matmul_precision("highest"):
            for step in STEPS:  # compiled now, so that generating times no compiling
                donated = (len(on_device),)  # (see `stablehlo`)
                function = jax.jit(step_function(model, config, step), donate_argnums=donated)
                steps[step] = function.lower(*arguments(model, config, step)).compile()
        super().__init__(steps, on_device, cache)
