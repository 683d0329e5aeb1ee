"""The outer step against torch.optim.SGD(nesterov=True) and a hand-computed reference."""

import numpy as np
import pytest
from pcp_nesterov import NesterovStep

from pcp_core.optimizers import OuterSettings


def test_hand_computed_two_steps() -> None:
    params = [np.array([1.0, 2.0], np.float32)]
    step = NesterovStep(OuterSettings(lr=0.5, momentum=0.9), params)
    step(params, [np.array([0.2, -0.4], np.float32)])
    # b = 0.2, -0.4; θ = θ − 0.5·(Δ + 0.9·b) = 1 − 0.5·0.38, 2 − 0.5·(−0.76)
    np.testing.assert_allclose(params[0], [0.81, 2.38], rtol=1e-6)
    step(params, [np.array([0.1, 0.0], np.float32)])
    # b = 0.9·0.2 + 0.1 = 0.28, 0.9·−0.4 = −0.36; θ −= 0.5·(Δ + 0.9·b)
    np.testing.assert_allclose(
        params[0], [0.81 - 0.5 * (0.1 + 0.252), 2.38 - 0.5 * -0.324], rtol=1e-6
    )


def test_matches_torch_sgd_nesterov() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    params = [
        rng.standard_normal((3, 4)).astype(np.float32),
        rng.standard_normal(5).astype(np.float32),
    ]
    reference = [torch.tensor(p.copy(), requires_grad=True) for p in params]
    sgd = torch.optim.SGD(reference, lr=0.7, momentum=0.9, nesterov=True)
    step = NesterovStep(OuterSettings(lr=0.7, momentum=0.9), params)
    for _ in range(6):
        delta = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
        step(params, delta)
        for tensor, d in zip(reference, delta, strict=True):
            tensor.grad = torch.tensor(d)
        sgd.step()
    for ours, theirs in zip(params, reference, strict=True):
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-5, atol=1e-6)
    restored = NesterovStep(OuterSettings(), params)
    restored.load_state(step.state())
    assert all(np.array_equal(a, b) for a, b in zip(restored.buffers, step.buffers, strict=True))
