"""What a model plugin provides: JAX init and loss functions over named parameters."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Parameters travel as an ordered name -> array mapping; the order is the model's and
# is what every wire format and checkpoint relies on.
Params = dict[str, Any]


@dataclass(frozen=True)
class Model:
    """A trainable model: `init(config, seed)` and `loss(config, params, x, y)` in JAX.

    `loss` is called with `precision=` one of `precisions` (see `pcp_core.program.precision`)
    only when that is not "f32"; a model that offers "bf16" routes its matrix
    products through `pcp_core.program.precision.matmul`.

    Optional: `presets` names sizes (`--model-size`), each a partial config over
    `defaults`; `shapes(config)` gives the parameters' shapes in `init`'s order without
    making them (for counting and memory estimates); `logits(config, params, tokens)`
    gives next-token logits [batch, time, vocab] (for `pcp sample` and `pcp export`);
    `decode(config, params, cache, tokens, start, last)` gives the logits [batch, vocab]
    at row `last` of `tokens` [batch, time] placed at positions `start`..., reading and
    writing a key/value cache of `cache_shape(config, batch)` (zeros at first), so that
    `pcp sample --backend` pays one position a token.
    """

    name: str
    defaults: Mapping[str, int]  # the model's size knobs and their defaults
    init: Callable[[Mapping[str, int], int], Params]
    loss: Callable[..., Any]
    validate: Callable[[Mapping[str, int]], None] = lambda config: None
    precisions: tuple[str, ...] = ("f32",)
    description: str = ""
    presets: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    shapes: Callable[[Mapping[str, int]], dict[str, tuple[int, ...]]] | None = None
    logits: Callable[..., Any] | None = None
    decode: Callable[..., Any] | None = None
    cache_shape: Callable[[Mapping[str, int], int], tuple[int, ...]] | None = None

    def check_precision(self, precision: str) -> None:
        if precision not in self.precisions:
            raise ValueError(
                f"model {self.name!r} trains in {', '.join(self.precisions)}, not {precision!r}"
            )

    def config(self, overrides: Mapping[str, Any], preset: str | None = None) -> dict[str, int]:
        """The model config: its defaults, then the named `preset`'s values, then the
        given (non-None) overrides."""
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(given) - set(self.defaults)
        if unknown:
            raise ValueError(f"model {self.name!r} has no setting(s) {sorted(unknown)}")
        merged = {**self.defaults, **self.preset(preset), **given}
        self.validate(merged)
        return merged

    def preset(self, name: str | None) -> Mapping[str, int]:
        """The settings of the named size (none for None); ValueError listing the known."""
        if name is None:
            return {}
        if name not in self.presets:
            known = ", ".join(self.presets) or "none"
            raise ValueError(f"model {self.name!r} has no size {name!r}; known sizes: {known}")
        return self.presets[name]
