"""The per-platform forms of the exported step compute what the portable program does.

The export for XLA on CUDA takes forms XLA compiles well there
(`pcp_core.program.platform_export.xla_on_cuda`); here they are switched on for the CPU,
so a machine without a GPU checks them against `jax_step`, which keeps the portable form.
"""

from typing import Any

import numpy as np
import pytest
from pcp_xla import BACKEND
from pcp_xla.runtime import XLA, XlaExecutor

from pcp_core.program import embedding, losses, nanogpt, platform_export
from pcp_core.program.build import build_train_program
from pcp_core.program.platform_export import export_platform, exporting_for, xla_on_cuda
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
    monkeypatch.setattr(platform_export, "XLA_FORMS_PLATFORM", PLATFORM)


@pytest.mark.usefixtures("xla_forms_here")
def test_the_xla_forms_train_as_the_portable_program() -> None:
    corpus, config, program = reference()
    exported, portable = run_both(program, corpus, config)
    np.testing.assert_allclose(exported, portable, rtol=2e-5)


@pytest.mark.usefixtures("xla_forms_here")
def test_the_bf16_forms_stay_near_the_policy() -> None:
    """The bf16 program in the CUDA export's forms (cuDNN's attention where there is a
    cuDNN, the MLP's hidden activation, layer norm's output, the residual branches'
    outputs and the logits in bf16, as torch.autocast rounds them) trains as the portable
    bf16 program does, within the 2% that bf16 keeps to f32."""
    import pcp_adamw

    from pcp_core.testing.reference import reference_settings

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
    got = np.asarray(embedding.sorted_embedding_gradient(rows, g, vocab))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_the_one_pass_logsumexp_is_logsumexp() -> None:
    from scipy.special import logsumexp

    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 7, 301)) * 30).astype(np.float32)
    x[0, 0, :] = -1e30  # every entry tiny: the running start must not make a NaN
    got = np.asarray(losses.logsumexp_in_one_pass(x))
    np.testing.assert_allclose(got[..., 0], logsumexp(x.astype(np.float64), axis=-1), rtol=1e-6)


def test_the_portable_program_is_traced_for_no_platform() -> None:
    assert export_platform() is None and not xla_on_cuda()
    with exporting_for("cuda"):
        assert export_platform() == "cuda" and xla_on_cuda()
    with exporting_for("cpu"):
        assert not xla_on_cuda()
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
