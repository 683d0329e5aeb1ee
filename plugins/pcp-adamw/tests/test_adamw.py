"""AdamW against torch.optim.AdamW (+ clip_grad_norm_ + the same LR schedule), step by step."""

import math

import numpy as np
import pcp_adamw
import pytest

from pcp_core.optimizers import InnerSettings

torch = pytest.importorskip("torch")


def torch_lr(settings: InnerSettings, step: int) -> float:
    """The schedule written out independently: linear warmup, then cosine to min_lr."""
    if step < settings.warmup_steps:
        return settings.lr * step / settings.warmup_steps
    progress = (step - settings.warmup_steps) / (settings.total_steps - settings.warmup_steps)
    progress = min(progress, 1.0)
    return settings.min_lr + 0.5 * (settings.lr - settings.min_lr) * (
        1 + math.cos(math.pi * progress)
    )


@pytest.mark.parametrize("grad_clip", [0.0, 0.5])
def test_matches_torch_adamw(grad_clip: float) -> None:
    import jax
    import jax.numpy as jnp

    settings = InnerSettings(
        lr=1e-2,
        min_lr=1e-3,
        warmup_steps=3,
        total_steps=12,
        grad_clip=grad_clip,
        own=pcp_adamw.AdamWSettings(beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1),
    )
    own = settings.own
    rng = np.random.default_rng(0)
    params = {
        "matrix": rng.standard_normal((4, 3)).astype(np.float32),
        "bias": rng.standard_normal(3).astype(np.float32),
    }
    grads = [
        {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in params.items()}
        for _ in range(settings.total_steps)
    ]

    tx = pcp_adamw.build(settings)
    ours = {k: jnp.asarray(v) for k, v in params.items()}
    state = tx.init(ours)
    update = jax.jit(tx.update)

    theirs = {
        k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()
    }
    torch_opt = torch.optim.AdamW(
        [
            {"params": [theirs["matrix"]], "weight_decay": own.weight_decay},
            {"params": [theirs["bias"]], "weight_decay": 0.0},
        ],  # decay on matrices only
        lr=settings.lr,
        betas=(own.beta1, own.beta2),
        eps=own.eps,
    )
    for step, grad in enumerate(grads):
        updates, state = update({k: jnp.asarray(v) for k, v in grad.items()}, state, ours)
        ours = jax.tree_util.tree_map(jnp.add, ours, updates)

        for name, tensor in theirs.items():
            tensor.grad = torch.tensor(grad[name], dtype=torch.float64)
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(list(theirs.values()), grad_clip)
        for group in torch_opt.param_groups:
            group["lr"] = torch_lr(settings, step)
        torch_opt.step()

        for name in params:
            np.testing.assert_allclose(
                np.asarray(ours[name]),
                theirs[name].detach().numpy(),
                rtol=2e-5,
                atol=2e-6,
                err_msg=f"{name} at step {step}",
            )


def test_a_schedule_step_set_ahead_moves_the_learning_rate_alone() -> None:
    """DiLoCo's budgeted rounds set a slow worker's schedule step to the run's position
    (thousands) while its moments hold a few steps: the update then has the learning
    rate of that position and the bias correction of the steps really taken."""
    import jax.numpy as jnp

    settings = InnerSettings(lr=1e-2, min_lr=1e-3, warmup_steps=10, total_steps=5000)
    tx = pcp_adamw.build(settings)
    params = {"bias": jnp.zeros(5)}
    grads = {"bias": jnp.asarray(np.random.default_rng(0).standard_normal(5), jnp.float32)}
    state = tx.init(params)
    for _ in range(3):
        _, state = tx.update(grads, state, params)
    ahead = state._replace(schedule_step=jnp.asarray(4000, jnp.int32))
    own_pace, _ = tx.update(grads, state, params)
    moved, after = tx.update(grads, ahead, params)
    ratio = torch_lr(settings, 4000) / torch_lr(settings, 3)
    np.testing.assert_allclose(moved["bias"], ratio * own_pace["bias"], rtol=1e-5)
    assert (int(after.count), int(after.schedule_step)) == (4, 4001)
