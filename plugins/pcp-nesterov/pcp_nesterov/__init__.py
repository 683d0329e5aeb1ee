"""Nesterov-momentum SGD over the averaged pseudo-gradient, in float32 on the shepherd.

For the pseudo-gradient Δ: b ← μ·b + Δ; θ ← θ − η·(Δ + μ·b), exactly what
`torch.optim.SGD(lr=η, momentum=μ, nesterov=True)` does with Δ as the gradient
(first step: b = Δ). Updates happen in place so the shepherd holds no extra copies.
"""

import numpy as np

from pcp_core import hookimpl
from pcp_core.optimizers import OuterOptimizer, OuterSettings
from pcp_core.parallel import pieces

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for


class NesterovStep:
    def __init__(self, settings: OuterSettings, params: list[np.ndarray]) -> None:
        self.lr = np.float32(settings.lr)
        self.momentum = np.float32(settings.momentum)
        self.buffers = [np.zeros_like(p, dtype=np.float32) for p in params]

    def __call__(self, params: list[np.ndarray], delta: list[np.ndarray]) -> None:
        delta = [np.ascontiguousarray(d, dtype=np.float32) for d in delta]
        pieces(self._step, params, delta, self.buffers)  # on the host's cores, a piece each

    def _step(self, theta: np.ndarray, d: np.ndarray, b: np.ndarray) -> None:
        b *= self.momentum
        b += d
        # θ −= η·(Δ + μ·b), without a temporary larger than a piece
        theta -= self.lr * d
        theta -= (self.lr * self.momentum) * b

    def state(self) -> dict[str, np.ndarray]:
        return {f"momentum.{i}": b for i, b in enumerate(self.buffers)}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        for i, b in enumerate(self.buffers):
            b[...] = state[f"momentum.{i}"]


NESTEROV = OuterOptimizer(
    name="nesterov",
    create=NesterovStep,
    description="Nesterov momentum SGD (DiLoCo outer step)",
)


@hookimpl
def pcp_register_optimizers(register) -> None:
    register(NESTEROV)
