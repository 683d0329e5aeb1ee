"""What a model plugin provides: JAX init and loss functions over named parameters."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Parameters travel as an ordered name -> array mapping; the order is the model's and
# is what every wire format and checkpoint relies on.
Params = dict[str, Any]


@dataclass(frozen=True)
class Model:
    """A trainable model: `init(config, seed)` and `loss(config, params, x, y)` in JAX.

    `loss` is called with `precision=` one of `precisions` (see `pcp_core.precision`)
    only when that is not "f32"; a model that offers "bf16" routes its matrix
    products through `pcp_core.precision.matmul`.
    """

    name: str
    defaults: Mapping[str, int]  # the model's size knobs and their defaults
    init: Callable[[Mapping[str, int], int], Params]
    loss: Callable[..., Any]
    validate: Callable[[Mapping[str, int]], None] = lambda config: None
    precisions: tuple[str, ...] = ("f32",)
    description: str = ""

    def check_precision(self, precision: str) -> None:
        if precision not in self.precisions:
            raise ValueError(
                f"model {self.name!r} trains in {', '.join(self.precisions)}, not {precision!r}"
            )

    def config(self, overrides: Mapping[str, Any]) -> dict[str, int]:
        """The model config: its defaults with the given (non-None) overrides applied."""
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(given) - set(self.defaults)
        if unknown:
            raise ValueError(f"model {self.name!r} has no setting(s) {sorted(unknown)}")
        merged = {**self.defaults, **given}
        self.validate(merged)
        return merged
