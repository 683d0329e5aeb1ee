"""The per-platform forms of the exported step compute what the portable program does.

The CUDA export takes forms XLA compiles well (pcp_core.program.layers.XLA_FORM_PLATFORMS,
BF16_PRODUCT_OUTPUT_PLATFORMS, GELU_RECOMPUTED_PLATFORMS, LAYER_NORM_STATISTICS_KEPT_PLATFORMS,
LAYER_NORM_ONE_PASS_PLATFORMS, DENSE_GELU_PLATFORMS, LAYER_NORM_ONE_SUM_PLATFORMS,
GELU_SIGMOID_PLATFORMS, losses.ONE_PASS_LOGSUMEXP_PLATFORMS,
nanogpt.SORTED_EMBEDDING_PLATFORMS, RESIDUAL_GRADIENT_KEPT_PLATFORMS, BF16_ATTENTION_PLATFORMS,
NORM_FOLDED_PLATFORMS, POSITION_ADDS_PLATFORMS,
pcp_core.program.precision.SINGLE_PRODUCT_PLATFORMS); here they are switched on for the CPU,
so a machine without a GPU checks them against `jax_step`, which keeps the portable form.
"""

from typing import Any

import numpy as np
import pytest
from pcp_xla import BACKEND
from pcp_xla.runtime import XLA, XlaExecutor

from pcp_core.program import layers, losses, nanogpt, precision
from pcp_core.program.build import build_train_program, export_platform, exporting_for
from pcp_core.testing.reference import BATCH, CALLS, STEPS_PER_CALL, initial_params, reference

PLATFORM = BACKEND.resolve_arch()


def run_both(program: Any, corpus: Any, config: dict[str, int]) -> tuple[list, list]:
    """The losses of CALLS calls through the xla backend's export and through jax_step."""
    artifact = XLA.build(program, BACKEND, PLATFORM)
    executor = XlaExecutor(artifact.data, program.param_specs, program.opt_specs)
    params = initial_params(config)
    opt_state = program.init_opt_state(params)
    executor.set_params(params)
    executor.set_opt_state(opt_state)
    state = (tuple(params), tuple(opt_state))
    exported, portable = [], []
    for call in range(CALLS):
        x, y = corpus.batches("train", STEPS_PER_CALL, BATCH, config["block_size"], (0, call))
        exported += list(executor.run(x, y))
        *state, losses = program.jax_step(*state, x, y)
        portable += list(np.asarray(losses))
    return exported, portable


@pytest.fixture
def xla_forms_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layers, "XLA_FORM_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(nanogpt, "SORTED_EMBEDDING_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(losses, "ONE_PASS_LOGSUMEXP_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(nanogpt, "BF16_ATTENTION_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(precision, "SINGLE_PRODUCT_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(layers, "BF16_PRODUCT_OUTPUT_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(layers, "GELU_RECOMPUTED_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(layers, "LAYER_NORM_STATISTICS_KEPT_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(nanogpt, "RESIDUAL_GRADIENT_KEPT_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(layers, "LAYER_NORM_ONE_PASS_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(layers, "DENSE_GELU_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(layers, "LAYER_NORM_ONE_SUM_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(layers, "GELU_SIGMOID_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(nanogpt, "NORM_FOLDED_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(nanogpt, "POSITION_ADDS_PLATFORMS", (PLATFORM,))


@pytest.mark.usefixtures("xla_forms_here")
def test_the_xla_forms_train_as_the_portable_program() -> None:
    corpus, config, program = reference()
    exported, portable = run_both(program, corpus, config)
    np.testing.assert_allclose(exported, portable, rtol=2e-5)


@pytest.mark.usefixtures("xla_forms_here")
def test_bf16_outputs_stay_near_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Products that round their outputs to bf16 (as torch.autocast) train as the bf16
    policy does, within the 2% that bf16 keeps to f32."""
    import pcp_adamw

    from pcp_core.testing.reference import reference_settings

    monkeypatch.setattr(precision, "BF16_OUTPUT_PLATFORMS", (PLATFORM,))
    corpus, config, _ = reference()
    tx = pcp_adamw.build(reference_settings(pcp_adamw.ADAMW))
    program = build_train_program(
        nanogpt.MODEL, config, tx, STEPS_PER_CALL, BATCH, precision="bf16"
    )
    exported, portable = run_both(program, corpus, config)
    np.testing.assert_allclose(exported, portable, rtol=0.02)


@pytest.mark.usefixtures("xla_forms_here")
@pytest.mark.parametrize("hidden", [False, True])
def test_the_bf16_forms_stay_near_the_policy(monkeypatch: pytest.MonkeyPatch, hidden: bool) -> None:
    """The bf16 program in the CUDA export's forms (on CUDA with cuDNN's attention and
    q, k, v in bf16), and with the MLP's hidden activation in bf16 (`hidden`), trains as
    the portable bf16 program does, within the 2% that bf16 keeps to f32."""
    import pcp_adamw

    from pcp_core.testing.reference import reference_settings

    if PLATFORM == "cuda":
        monkeypatch.setattr(nanogpt, "FUSED_ATTENTION_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(precision, "BF16_HIDDEN_PLATFORMS", (PLATFORM,) if hidden else ())
    corpus, config, _ = reference()
    tx = pcp_adamw.build(reference_settings(pcp_adamw.ADAMW))
    program = build_train_program(
        nanogpt.MODEL, config, tx, STEPS_PER_CALL, BATCH, precision="bf16"
    )
    exported, portable = run_both(program, corpus, config)
    np.testing.assert_allclose(exported, portable, rtol=0.02)


@pytest.mark.usefixtures("xla_forms_here")
@pytest.mark.parametrize(
    "rounded",
    [
        "BF16_NORM_OUTPUT_PLATFORMS",
        "BF16_RESIDUAL_BRANCH_PLATFORMS",
        "BF16_LOGITS_PLATFORMS",
        "all",
    ],
)
def test_autocast_roundings_stay_near_the_policy(
    monkeypatch: pytest.MonkeyPatch, rounded: str
) -> None:
    """Layer norm's output, the residual branches' outputs and the logits rounded to bf16
    (nanogpt's `BF16_*_PLATFORMS`, as torch.autocast rounds them) train as the portable
    bf16 program does, within the 2% that bf16 keeps to f32."""
    import pcp_adamw

    from pcp_core.testing.reference import reference_settings

    names = [
        "BF16_NORM_OUTPUT_PLATFORMS",
        "BF16_RESIDUAL_BRANCH_PLATFORMS",
        "BF16_LOGITS_PLATFORMS",
    ]
    for name in names if rounded == "all" else [rounded]:
        monkeypatch.setattr(nanogpt, name, (PLATFORM,))
    if PLATFORM == "cuda":
        monkeypatch.setattr(nanogpt, "FUSED_ATTENTION_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(precision, "BF16_HIDDEN_PLATFORMS", (PLATFORM,))
    corpus, config, _ = reference()
    tx = pcp_adamw.build(reference_settings(pcp_adamw.ADAMW))
    program = build_train_program(
        nanogpt.MODEL, config, tx, STEPS_PER_CALL, BATCH, precision="bf16"
    )
    exported, portable = run_both(program, corpus, config)
    np.testing.assert_allclose(exported, portable, rtol=0.02)


def test_the_sorted_embedding_gradient_is_the_one_hot_product() -> None:
    """Sums of each token's rows, repeated tokens and absent ones included."""
    rng = np.random.default_rng(0)
    vocab, rows = 11, np.array([3, 0, 3, 7, 3, 10, 0, 5, 5, 3, 1, 3], np.int32)
    g = rng.standard_normal((rows.size, 6)).astype(np.float32)
    expected = np.zeros((vocab, 6), np.float64)
    np.add.at(expected, rows, g.astype(np.float64))
    got = np.asarray(layers.sorted_embedding_gradient(rows, g, vocab))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_the_one_pass_logsumexp_is_logsumexp() -> None:
    from scipy.special import logsumexp

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 7, 301)) * 30).astype(np.float32)
    x[0, 0, :] = -1e30  # every entry tiny: the running start must not make a NaN
    got = np.asarray(losses.logsumexp_in_one_pass(x))
    np.testing.assert_allclose(got[..., 0], logsumexp(x.astype(np.float64), axis=-1), rtol=1e-6)


def test_the_portable_program_is_traced_for_no_platform() -> None:
    assert export_platform() is None
    with exporting_for("cuda"):
        assert export_platform() == "cuda"
    assert export_platform() is None


@pytest.mark.skipif(PLATFORM == "cuda", reason="a CUDA jax has cuDNN to export with")
def test_without_cudnn_the_cuda_export_keeps_the_portable_attention() -> None:
    import jax
    import pcp_adamw

    from pcp_core.testing.reference import reference_settings

    _, config, _ = reference()
    tx = pcp_adamw.build(reference_settings(pcp_adamw.ADAMW))
    program = build_train_program(nanogpt.MODEL, config, tx, 1, BATCH, precision="bf16")
    exported = jax.export.deserialize(bytearray(XLA.build(program, BACKEND, "cuda").data))
    assert "fmha" not in exported.mlir_module()
