"""Mixed precision: bf16 matrix products with f32 accumulation, against f32."""

from pathlib import Path

import numpy as np
import pytest

from pcp_core.config import PRECISIONS, ConfigError, RunConfig
from pcp_core.data import text as data
from pcp_core.optimizers import InnerSettings
from pcp_core.program import nanogpt, precision
from pcp_core.program.build import build_eval_program, build_train_program
from tests.conftest import run_pcp
from tests.test_program import train_side_by_side

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32}


def relative_error(actual, expected) -> float:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def test_weight_gradient_is_the_transposed_product() -> None:
    rng = np.random.default_rng(0)
    a, g = rng.standard_normal((4, 16, 24)), rng.standard_normal((4, 16, 40))
    for policy, tolerance in (("f32", 1e-6), ("bf16", 1e-2)):
        got = precision.weight_gradient(a.astype(np.float32), g.astype(np.float32), policy)
        expected = a.reshape(64, 24).T @ g.reshape(64, 40)
        assert got.dtype == np.float32 and relative_error(got, expected) < tolerance


def test_bf16_gradients_stay_close_to_f32() -> None:
    import jax

    config = nanogpt.MODEL.config({**TINY, "vocab_size": 60})
    params = nanogpt.init(config, 0)
    rng = np.random.default_rng(1)
    x, y = (rng.integers(0, 60, (8, 32)).astype(np.int32) for _ in range(2))
    grads = {
        policy: jax.grad(lambda p, policy=policy: nanogpt.loss(config, p, x, y, policy))(params)
        for policy in PRECISIONS
    }
    assert all(grads["bf16"][name].dtype == np.float32 for name in params)
    errors = {name: relative_error(grads["bf16"][name], grads["f32"][name]) for name in params}
    # bf16 keeps 8 bits of mantissa: ~0.4% per rounding, a few percent after a network
    assert max(e for n, e in errors.items() if n != "h.0.attn.c_attn.bias") < 0.03, errors


def test_iree_cpu_matches_jax_in_bf16() -> None:
    import pcp_adamw

    corpus = data.load_text_file(None)
    config = nanogpt.MODEL.config({**TINY, "vocab_size": corpus.vocab_size})
    tx = pcp_adamw.build(
        InnerSettings(
            lr=3e-3, warmup_steps=2, total_steps=12, own=pcp_adamw.AdamWSettings(eps=1e-6)
        )
    )
    program = build_train_program(nanogpt.MODEL, config, tx, 4, 8, precision="bf16")
    assert "bf16" in program.stablehlo
    executor, jax_params, _, _ = train_side_by_side(corpus, config, program, rtol=2e-3)
    ours = np.concatenate([p.ravel() for p in executor.params()])
    assert relative_error(ours, np.concatenate([np.ravel(p) for p in jax_params])) < 1e-3


def test_unknown_precision_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="precision must be one of f32, bf16"):
        RunConfig(precision="fp8").validate()
    result = run_pcp("train", "--precision", "fp16")
    assert result.returncode == 2 and "precision must be one of" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_model_without_bf16_refuses_it() -> None:
    import dataclasses

    import pcp_adamw

    f32_only = dataclasses.replace(nanogpt.MODEL, precisions=("f32",))
    config = f32_only.config({**TINY, "vocab_size": 60})
    with pytest.raises(ValueError, match="trains in f32, not 'bf16'"):
        build_train_program(
            f32_only, config, pcp_adamw.build(InnerSettings()), 1, 2, precision="bf16"
        )


def test_pcp_train_in_bf16(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32"]
    result = run_pcp("train", *args, "--steps", "20", "--precision", "bf16", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert 'precision = "bf16"' in (out / "config.toml").read_text()


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"no {SHAKESPEARE} here")
def test_bf16_loss_curve_follows_f32_on_tinyshakespeare() -> None:
    """300 steps of the default model at each precision on real text, same batches.

    Tolerance: the validation loss every 50 steps within 2% of the f32 run's, and the
    training loss averaged over each 50 steps within 0.05 nats. The program runs
    through XLA on the CPU here (IREE computes the same: see the test above); IREE's
    CPU backend runs bf16 products about 12x slower than f32.
    """
    import pcp_adamw

    corpus = data.load_text_file(SHAKESPEARE)
    config = nanogpt.MODEL.config({"vocab_size": corpus.vocab_size})
    tx = pcp_adamw.build(InnerSettings(total_steps=300))
    curves = {}
    for policy in PRECISIONS:
        program = build_train_program(nanogpt.MODEL, config, tx, 10, 16, precision=policy)
        evaluation = build_eval_program(nanogpt.MODEL, config, 8, 16, precision=policy)
        params = list(nanogpt.init(config, 0).values())
        state = (tuple(params), tuple(program.init_opt_state(params)))
        val_x, val_y = corpus.batches("validation", 8, 16, config["block_size"], (0, 1))
        losses, val_losses = [], []
        for call in range(30):
            x, y = corpus.batches("train", 10, 16, config["block_size"], (0, call))
            *state, call_losses = program.jax_step(*state, x, y)
            losses.extend(np.asarray(call_losses).tolist())
            if call % 5 == 4:
                *_, batch_losses = evaluation.jax_step(state[0], (), val_x, val_y)
                val_losses.append(float(np.mean(batch_losses)))
        curves[policy] = np.array(losses), np.array(val_losses)
    (f32_train, f32_val), (bf16_train, bf16_val) = curves["f32"], curves["bf16"]
    assert f32_val[-1] < 0.8 * f32_train[0]  # it learns
    np.testing.assert_array_less(np.abs(bf16_val - f32_val), 0.02 * f32_val)
    window_means = [curve.reshape(-1, 50).mean(axis=1) for curve in (bf16_train, f32_train)]
    np.testing.assert_array_less(np.abs(window_means[0] - window_means[1]), 0.05)


def test_backend_without_bf16_refuses_it_in_one_line(tmp_path: Path) -> None:
    for command in (["train", "--backend", "vulkan"], ["compile", "--backend", "metal"]):
        result = run_pcp(
            *command,
            "--precision",
            "bf16",
            "-o" if "compile" in command else "--out",
            str(tmp_path / "x"),
        )
        assert result.returncode == 2, result.stderr
        assert "cannot train in bf16 (it supports f32)" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
