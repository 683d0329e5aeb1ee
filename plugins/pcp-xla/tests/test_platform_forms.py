"""The per-platform forms of the exported step compute what the portable program does.

The CUDA export takes forms XLA compiles well (pcp_core.program.nanogpt.XLA_FORM_PLATFORMS,
pcp_core.program.precision.SINGLE_PRODUCT_PLATFORMS); here they are switched on for the CPU,
so a machine without a GPU checks them against `jax_step`, which keeps the portable form.
"""

from typing import Any

import numpy as np
import pytest
from pcp_xla import BACKEND
from pcp_xla.runtime import XLA, XlaExecutor

from pcp_core.program import nanogpt, precision
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
    monkeypatch.setattr(nanogpt, "XLA_FORM_PLATFORMS", (PLATFORM,))
    monkeypatch.setattr(precision, "SINGLE_PRODUCT_PLATFORMS", (PLATFORM,))


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
    tx = pcp_adamw.build(reference_settings())
    program = build_train_program(
        nanogpt.MODEL, config, tx, STEPS_PER_CALL, BATCH, precision="bf16"
    )
    exported, portable = run_both(program, corpus, config)
    np.testing.assert_allclose(exported, portable, rtol=0.02)


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
    tx = pcp_adamw.build(reference_settings())
    program = build_train_program(nanogpt.MODEL, config, tx, 1, BATCH, precision="bf16")
    exported = jax.export.deserialize(bytearray(XLA.build(program, BACKEND, "cuda").data))
    assert "fmha" not in exported.mlir_module()
