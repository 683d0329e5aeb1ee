"""The compiled train program: IREE on the CPU against JAX, the compile cache, device state."""

import numpy as np
import pytest
from structlog.testing import capture_logs

from pcp_core.data import text as data
from pcp_core.iree.compiler import compile_program
from pcp_core.iree.executor import IreeExecutor
from pcp_core.iree.transfers import assert_state_stays_on_device
from pcp_core.optimizers import InnerSettings, schedule_values
from pcp_core.program import nanogpt, portable_attention
from pcp_core.program.build import SCHEDULE_TENSOR, build_train_program

TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32}


@pytest.fixture(scope="module")
def corpus() -> data.CharCorpus:
    return data.load_text_file(None)


@pytest.fixture(scope="module")
def program(corpus: data.CharCorpus):
    import pcp_adamw

    config = nanogpt.MODEL.config({**TINY, "vocab_size": corpus.vocab_size})
    settings = InnerSettings(lr=3e-3, warmup_steps=2, total_steps=12)
    tx, schedule = pcp_adamw.build(settings), schedule_values(settings)
    return config, build_train_program(nanogpt.MODEL, config, tx, 4, 8, schedule=schedule)


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-12))


def train_side_by_side(corpus: data.CharCorpus, config, prog, rtol: float, unrolled=False):
    """Three calls of `prog` through IREE on the CPU and through JAX from the same start,
    their losses equal to `rtol`; returns the executor, JAX's state and IREE's losses.
    `unrolled`: IREE runs the steps straight-line (`Backend.unroll_steps`), JAX the loop."""
    import pcp_cpu

    stablehlo = prog.stablehlo_for(unrolled)
    compiled = compile_program(stablehlo, pcp_cpu.CPU, pcp_cpu.CPU.resolve_arch())
    executor = IreeExecutor(compiled.vmfb, "local-task", prog.param_specs, prog.opt_specs)
    params = list(nanogpt.init(config, seed=0).values())
    opt_state = prog.init_opt_state(params)
    executor.set_params(params)
    executor.set_opt_state(opt_state)
    jax_params, jax_opt = tuple(params), tuple(opt_state)
    for call in range(3):
        x, y = corpus.batches("train", 4, 8, config["block_size"], stream=(0, call))
        iree_losses = executor.run(x, y)
        jax_params, jax_opt, jax_losses = prog.jax_step(jax_params, jax_opt, x, y)
        np.testing.assert_allclose(iree_losses, np.asarray(jax_losses), rtol=rtol)
    return executor, jax_params, jax_opt, iree_losses


def test_iree_cpu_matches_jax(corpus: data.CharCorpus, program) -> None:
    config, prog = program
    executor, jax_params, jax_opt, iree_losses = train_side_by_side(corpus, config, prog, 1e-4)
    assert iree_losses[-1] < iree_losses[0]  # it learns
    for spec, ours, theirs in zip(prog.param_specs, executor.params(), jax_params, strict=True):
        assert relative_error(ours, np.asarray(theirs)) < 1e-4, spec.name
    for spec, ours, theirs in zip(prog.opt_specs, executor.opt_state(), jax_opt, strict=True):
        assert relative_error(ours, np.asarray(theirs)) < 1e-4, spec.name


def test_the_unrolled_steps_compute_what_the_loop_does(corpus: data.CharCorpus, program) -> None:
    config, prog = program
    assert "stablehlo.while" in prog.stablehlo
    assert "stablehlo.while" not in prog.stablehlo_for(unrolled=True)
    executor, jax_params, _, _ = train_side_by_side(corpus, config, prog, 1e-4, unrolled=True)
    for spec, ours, theirs in zip(prog.param_specs, executor.params(), jax_params, strict=True):
        assert relative_error(ours, np.asarray(theirs)) < 1e-4, spec.name


@pytest.mark.parametrize(("block", "last"), [(8, 8), (12, 8)])
def test_attention_in_query_blocks_is_causal_attention(block: int, last: int, monkeypatch) -> None:
    """Blocks of queries (the last one shorter where the context is no multiple), each
    against the keys up to its own last query: jax's causal attention."""
    import jax

    monkeypatch.setattr(portable_attention, "QUERY_BLOCK", block)
    q, k, v = np.random.default_rng(0).standard_normal((3, 4, 2, 32, 16)).astype(np.float32)
    blocked = portable_attention.causal_attention(q, k, v, "f32")
    swap = lambda a: a.transpose(0, 2, 1, 3)  # noqa: E731  ([batch, time, heads, width])
    expected = swap(jax.nn.dot_product_attention(swap(q), swap(k), swap(v), is_causal=True))
    np.testing.assert_allclose(blocked, expected, rtol=1e-5, atol=1e-6)
    # a function of this test's own: jax keeps a function's trace, which would outlive the patch
    attention = lambda q, k, v: portable_attention.causal_attention(q, k, v, "f32")  # noqa: E731
    traced = str(jax.make_jaxpr(attention)(q, k, v))
    assert f"f32[4,2,{block},{block}]" in traced and f"f32[4,2,{last},32]" in traced
    assert "f32[4,2,32,32]" not in traced  # [batch, heads, queries, keys] scores


def test_a_step_with_attention_in_blocks_is_the_whole_squares(
    corpus: data.CharCorpus, monkeypatch
) -> None:
    """The loss and gradients of four blocks of 8 queries are those of the one [32, 32]
    square, and IREE on the CPU trains the blocked program as JAX does."""
    import jax
    import pcp_adamw

    config = nanogpt.MODEL.config({**TINY, "vocab_size": corpus.vocab_size})
    params = nanogpt.init(config, seed=0)
    x, y = corpus.batches("train", 1, 4, config["block_size"], stream=(0, 0))
    loss = lambda p: nanogpt.loss(config, p, x[0], y[0])  # noqa: E731
    loss_and_gradients = {}
    for block in (32, 8):
        monkeypatch.setattr(portable_attention, "QUERY_BLOCK", block)
        loss_and_gradients[block] = jax.value_and_grad(loss)(params)
    (whole, whole_grads), (blocked, blocked_grads) = loss_and_gradients[32], loss_and_gradients[8]
    np.testing.assert_allclose(blocked, whole, rtol=1e-6)
    for name, expected in whole_grads.items():
        assert relative_error(np.asarray(blocked_grads[name]), np.asarray(expected)) < 1e-5, name

    settings = InnerSettings(lr=3e-3, warmup_steps=2, total_steps=12)
    tx, schedule = pcp_adamw.build(settings), schedule_values(settings)
    prog = build_train_program(nanogpt.MODEL, config, tx, 4, 8, schedule=schedule)
    train_side_by_side(corpus, config, prog, 1e-4)


def test_state_stays_on_device(corpus: data.CharCorpus, program) -> None:
    import pcp_cpu

    config, prog = program
    compiled = compile_program(prog.stablehlo, pcp_cpu.CPU, pcp_cpu.CPU.resolve_arch())
    executor = IreeExecutor(compiled.vmfb, "local-task", prog.param_specs, prog.opt_specs)
    params = list(nanogpt.init(config, seed=0).values())
    executor.set_params(params)
    executor.set_opt_state(prog.init_opt_state(params))
    before = executor.device_state()
    batches = [corpus.batches("train", 4, 8, 32, stream=(0, i)) for i in range(2)]
    assert_state_stays_on_device(executor, batches)
    after = executor.device_state()
    assert len(after) == len(before)
    assert all(type(a).__name__ == "DeviceArray" for a in after)
    assert all(a is not b for a, b in zip(after, before, strict=True))  # outputs fed back


def test_compile_cache_hit(program, tmp_path, monkeypatch) -> None:
    import pcp_cpu

    monkeypatch.setenv("PCP_CACHE_DIR", str(tmp_path))
    _, prog = program
    with capture_logs() as first_logs:
        first = compile_program(prog.stablehlo, pcp_cpu.CPU, "x86-64")
    with capture_logs() as second_logs:
        second = compile_program(prog.stablehlo, pcp_cpu.CPU, "x86-64")
    assert not first.cache_hit and second.cache_hit
    assert first.vmfb == second.vmfb and first.sha256 == second.sha256
    assert any(e["event"] == "compiled" for e in first_logs)
    assert any("cache hit" in e["event"] for e in second_logs)
    assert not any(e["event"] == "compiled" for e in second_logs)
    other_arch = compile_program(prog.stablehlo, pcp_cpu.CPU, "x86-64-v2")
    assert not other_arch.cache_hit  # the key covers the flags


def test_program_text_has_no_call_site_locations(program) -> None:
    """The cache key must not depend on which file and line built the program."""
    _, prog = program
    assert "loc(" not in prog.stablehlo and ".py" not in prog.stablehlo
    assert prog.stablehlo.startswith("module @jit_train_step")


def test_one_program_for_every_schedule(corpus: data.CharCorpus) -> None:
    """A program that carries its learning-rate schedule as state is the same text for
    every schedule (a new --steps compiles nothing), and trains exactly as the program
    with that schedule as constants."""
    import jax
    import pcp_adamw

    config = nanogpt.MODEL.config({**TINY, "n_layer": 1, "vocab_size": corpus.vocab_size})

    def built(settings: InnerSettings, carried: bool):
        schedule = schedule_values(settings) if carried else None
        tx = pcp_adamw.build(settings)
        return build_train_program(nanogpt.MODEL, config, tx, 4, 8, schedule=schedule)

    short = InnerSettings(lr=3e-3, min_lr=3e-4, warmup_steps=2, total_steps=12)
    long = InnerSettings(
        lr=1e-3, min_lr=1e-5, warmup_steps=50, total_steps=100_000, schedule="wsd", decay_steps=9
    )
    carried, baked = built(short, carried=True), built(short, carried=False)
    assert carried.stablehlo == built(long, carried=True).stablehlo
    assert baked.stablehlo != built(long, carried=False).stablehlo
    assert [s.name for s in carried.opt_specs] == [
        *(s.name for s in baked.opt_specs),
        SCHEDULE_TENSOR,
    ]

    params = list(nanogpt.init(config, seed=0).values())
    states = [tuple(carried.init_opt_state(params)), tuple(baked.init_opt_state(params))]
    assert np.array_equal(states[0][-1], np.float32([3e-3, 3e-4, 2, 12, 0, 0]))
    weights = [tuple(params), tuple(params)]
    for call in range(4):  # through the warmup and into the decay
        x, y = corpus.batches("train", 4, 8, config["block_size"], stream=(0, call))
        runs = [
            prog.jax_step(w, state, x, y)
            for prog, w, state in zip((carried, baked), weights, states, strict=True)
        ]
        np.testing.assert_allclose(np.asarray(runs[0][2]), np.asarray(runs[1][2]), rtol=1e-6)
        weights, states = [run[0] for run in runs], [run[1] for run in runs]
    # XLA fuses baked constants otherwise than state: on an AMD EPYC host two of 96
    # weights near zero (7e-7) differed by 1.2e-7, float32 rounding of weights of 1e-2
    for ours, theirs in zip(*weights, strict=True):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-6)
    assert jax.numpy.array_equal(states[0][-1], carried.init_opt_state(params)[-1])


def test_remat_blocks_gives_the_same_loss_and_gradients(corpus: data.CharCorpus) -> None:
    """`--remat blocks` (nanogpt's `remat` 1) recomputes each block in the backward pass:
    the traced step differs (each block under jax.checkpoint), the loss and gradients do
    not (f32, on the CPU)."""
    import jax
    import pcp_adamw

    config = nanogpt.MODEL.config({**TINY, "vocab_size": corpus.vocab_size})
    remat = {**config, "remat": nanogpt.REMAT_BLOCKS}
    params = nanogpt.init(config, seed=0)
    x, y = corpus.batches("train", 1, 4, config["block_size"], stream=(0, 0))

    def loss_and_gradients(model_config: dict[str, int]):
        return jax.value_and_grad(lambda p: nanogpt.loss(model_config, p, x[0], y[0]))(params)

    (loss, grads), (remat_loss, remat_grads) = map(loss_and_gradients, (config, remat))
    np.testing.assert_allclose(float(remat_loss), float(loss), rtol=1e-6)
    for name in params:
        np.testing.assert_allclose(remat_grads[name], grads[name], rtol=1e-5, atol=1e-7)

    def products(model_config: dict[str, int]) -> int:
        """The matrix products of the gradient's trace: the forward pass's again with remat."""
        step = jax.grad(lambda p: nanogpt.loss(model_config, p, x[0], y[0]))
        return str(jax.make_jaxpr(step)(params)).count("dot_general")

    assert products(remat) > products(config)
    tx = pcp_adamw.build(InnerSettings())
    programs = [build_train_program(nanogpt.MODEL, c, tx, 1, 4) for c in (config, remat)]
    products = [p.stablehlo.count("stablehlo.dot_general") for p in programs]
    assert products[1] > products[0]
    # a platform's export fences the recomputation; the portable program (IREE's) does not
    assert "optimization_barrier" not in programs[1].stablehlo
    assert "optimization_barrier" in programs[1].export("cpu", 1).mlir_module()


def test_remat_blocks_trains_on_iree_as_in_jax(corpus: data.CharCorpus) -> None:
    """The rematerialised step through IREE on the CPU as in JAX. With optimization
    barriers around the recomputed blocks, IREE 3.13 gave another loss by the fourth step
    here (3.583 against 3.537), and at batch 16 its runtime failed."""
    import pcp_adamw

    config = nanogpt.MODEL.config({"vocab_size": corpus.vocab_size, "remat": 1})
    settings = InnerSettings(lr=3e-3, warmup_steps=2, total_steps=12)
    tx, schedule = pcp_adamw.build(settings), schedule_values(settings)
    prog = build_train_program(nanogpt.MODEL, config, tx, 4, 8, schedule=schedule)
    train_side_by_side(corpus, config, prog, rtol=2e-5)


def test_remat_setting_and_what_it_saves() -> None:
    """`--remat` reaches the model as its `remat` setting, a model without one refuses
    anything but none, and the memory estimate keeps a block's input a layer instead of
    its activations."""
    from pcp_core.config import RunConfig
    from pcp_core.models import Model
    from pcp_core.program import footprint
    from pcp_core.program.training import remat_setting

    assert remat_setting(nanogpt.MODEL, RunConfig()) == {}
    assert remat_setting(nanogpt.MODEL, RunConfig(remat="blocks")) == {"remat": 1}
    with pytest.raises(ValueError, match="remat must be one of none, blocks"):
        remat_setting(nanogpt.MODEL, RunConfig(remat="layers"))
    plain = Model(name="plain", defaults={"width": 4}, init=lambda c, s: {}, loss=lambda: 0)
    assert remat_setting(plain, RunConfig(model="plain")) == {}
    with pytest.raises(ValueError, match="no rematerialisation"):
        remat_setting(plain, RunConfig(model="plain", remat="blocks"))
    with pytest.raises(ValueError, match="remat must be 0 or 1"):
        nanogpt.MODEL.config({"remat": 2})

    xl = nanogpt.MODEL.config({"vocab_size": 50304}, preset="gpt2-xl")
    assert 1.55e9 < sum(np.prod(s) for s in nanogpt.shapes(xl).values()) < 1.56e9
    kept = footprint.activation_floats(xl, 8)
    saved = footprint.activation_floats({**xl, "remat": 1}, 8)
    assert saved is not None and kept is not None and saved < kept / 5
