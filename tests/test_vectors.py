"""The model's vectors joined into one tensor inside a train step (pcp_core.program.vectors):
the joined step computes what the portable one does, and only where it may."""

import numpy as np
import pytest

from pcp_core.data import text as data
from pcp_core.optimizers import InnerSettings, schedule_values
from pcp_core.program import nanogpt, vectors
from pcp_core.program.build import build_train_program

TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32}


def tiny_params() -> dict[str, np.ndarray]:
    return nanogpt.init(nanogpt.MODEL.config({**TINY, "vocab_size": 65}), seed=0)


def adamw(grad_clip: float = 1.0):
    """AdamW with an eps of 1e-6: the attention key bias's gradient is exactly zero, and
    1e-8 would turn the two programs' rounding noise there into updates of 1e-6."""
    import pcp_adamw

    own = pcp_adamw.AdamWSettings(eps=1e-6)
    settings = InnerSettings(lr=3e-3, warmup_steps=2, total_steps=12, grad_clip=grad_clip, own=own)
    return pcp_adamw.build(settings), schedule_values(settings)


def test_join_then_split_gives_back_every_tensor() -> None:
    import jax

    params = tiny_params()
    tx, _ = adamw()
    state = tx.init(params)
    group = vectors.vector_group("cuda", tx, params)
    assert group is not None
    assert set(group.names) == {n for n, p in params.items() if p.ndim == 1}

    joined_params, joined_state = group.join((params, state))
    assert joined_params[vectors.GROUP_KEY].shape == (sum(group.sizes),)
    assert not set(group.names) & set(joined_params)
    assert vectors.GROUP_KEY in joined_state.mu and vectors.GROUP_KEY in joined_state.nu

    restored = group.split((joined_params, joined_state))
    before = jax.tree_util.tree_flatten_with_path((params, state))[0]
    after = jax.tree_util.tree_flatten_with_path(restored)[0]
    assert [path for path, _ in before] == [path for path, _ in after]
    for (path, a), (_, b) in zip(before, after, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))


def test_only_an_elementwise_optimizer_on_a_listed_platform_gets_the_group() -> None:
    import optax

    params = tiny_params()
    tx, _ = adamw()
    assert vectors.vector_group("cuda", tx, params) is not None
    assert vectors.vector_group("cpu", tx, params) is None  # not in GROUPED_PLATFORMS
    assert vectors.vector_group(None, tx, params) is None  # the portable program
    assert vectors.vector_group("cuda", optax.adamw(1e-3), params) is None  # undeclared
    matrices = {n: p for n, p in params.items() if p.ndim == 2}
    assert vectors.vector_group("cuda", tx, matrices) is None  # nothing to join


@pytest.mark.parametrize("grad_clip", [1.0, 0.0])
def test_the_joined_step_trains_as_the_portable_one(
    monkeypatch: pytest.MonkeyPatch, grad_clip: float
) -> None:
    """The step exported for the CPU with its vectors joined gives the parameters, the
    moments and the losses of the portable step, tensor by tensor, after two calls."""
    import jax

    monkeypatch.setattr(vectors, "GROUPED_PLATFORMS", ("cpu",))
    corpus = data.load_text_file(None)
    config = nanogpt.MODEL.config({**TINY, "vocab_size": corpus.vocab_size})
    tx, schedule = adamw(grad_clip)
    program = build_train_program(nanogpt.MODEL, config, tx, 4, 8, schedule=schedule)
    exported = program.export("cpu")
    params = list(nanogpt.init(config, seed=0).values())
    joined_length = sum(int(p.size) for p in params if p.ndim == 1)
    assert f"tensor<{joined_length}xf32>" in exported.mlir_module()  # it did join

    state = tuple(params), tuple(program.init_opt_state(params))
    joined_state = state
    for call in range(2):
        x, y = corpus.batches("train", 4, 8, config["block_size"], stream=(0, call))
        *state, losses = program.jax_step(*state, x, y)
        *joined_state, joined_losses = jax.jit(exported.call)(*joined_state, x, y)
        np.testing.assert_allclose(joined_losses, losses, rtol=1e-5)
    for spec, a, b in zip(
        program.param_specs + program.opt_specs,
        [*state[0], *state[1]],
        [*joined_state[0], *joined_state[1]],
        strict=True,
    ):
        np.testing.assert_allclose(
            np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6, err_msg=spec.name
        )
