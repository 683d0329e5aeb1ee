"""The tiny reference run every conformance suite checks a plugin with.

One small program (a 1-layer model, a few steps of batch 4) that any backend compiles
in seconds, and the comparison of an IREE executor against JAX on the CPU: the same
program, the same batches, losses and parameters within a tolerance.
"""

import dataclasses
from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from pcp_core.optimizers import InnerOptimizer

REFERENCE_MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16}
STEPS_PER_CALL, BATCH, CALLS = 2, 4, 3


def on_cpu() -> Any:
    """JAX runs the reference on the CPU, also on a machine whose default is a GPU."""
    import jax

    return jax.default_device(jax.devices("cpu")[0])


def reference_settings(optimizer: Any) -> Any:
    """The reference run's schedule, and `optimizer`'s own settings at their defaults
    but for an `eps` of 1e-6, where it has one: the attention key bias has an exactly-zero
    gradient, and a tiny eps (AdamW's 1e-8) would let an Adam-like optimizer turn each
    backend's rounding noise there into real updates."""
    from pcp_core.optimizers import InnerSettings

    own = optimizer.settings() if optimizer.settings is not None else None
    if own is not None and "eps" in {f.name for f in dataclasses.fields(own)}:
        own = dataclasses.replace(own, eps=1e-6)
    steps = STEPS_PER_CALL * CALLS
    return InnerSettings(lr=3e-3, warmup_steps=1, total_steps=steps, own=own)


@cache
def reference(
    model: str = "nanogpt",
    optimizer: str = "adamw",
    overrides: tuple[tuple[str, int], ...] = tuple(REFERENCE_MODEL.items()),
) -> tuple[Any, dict[str, int], Any]:
    """The corpus, model config and train program for `model` trained by `optimizer`."""
    from pcp_core import plugins
    from pcp_core.data import text as data
    from pcp_core.optimizers import schedule_values
    from pcp_core.program.build import build_train_program

    host = plugins.host()
    corpus = data.load_text_file(None)
    the_model = host.model(model)
    config = the_model.config({**dict(overrides), "vocab_size": corpus.vocab_size})
    inner = cast("InnerOptimizer", host.optimizer(optimizer))  # the run's, an inner one
    settings = reference_settings(inner)
    with on_cpu():  # the schedule as state, as `pcp train` builds it
        program = build_train_program(
            the_model,
            config,
            inner.build(settings),
            STEPS_PER_CALL,
            BATCH,
            schedule=schedule_values(settings),
        )
    return corpus, config, program


def initial_params(config: Mapping[str, int], model: str = "nanogpt") -> list[np.ndarray]:
    from pcp_core import plugins

    return list(plugins.host().model(model).init(config, 0).values())


def open_executor(backend: Any, artifact: bytes, program: Any, params: list[np.ndarray]) -> Any:
    """The backend's executor for `artifact` holding `params` and the program's initial
    state."""
    executor = backend.runtime.open(artifact, backend, program, None)
    with on_cpu():
        opt_state = program.init_opt_state(params)
    executor.set_params(params)
    executor.set_opt_state(opt_state)
    return executor


def assert_matches_jax(
    backend: Any,
    artifact: bytes,
    reference_run: tuple[Any, Mapping[str, int], Any],
    params: list[np.ndarray],
    rtol: float,
    unstable: tuple[str, ...] = (),
) -> list[float]:
    """Run CALLS calls through the backend and through JAX on the CPU; return the
    backend's losses.

    Parameters named in `unstable` are only checked to be finite: their gradient is
    zero in exact arithmetic (nanoGPT's attention key bias), so an update that takes
    its sign (Lion, signSGD) moves them by each compiler's own rounding noise.
    """
    corpus, config, program = reference_run
    executor = open_executor(backend, artifact, program, params)
    with on_cpu():
        jax_params, jax_opt = tuple(params), tuple(program.init_opt_state(params))
    all_losses: list[float] = []
    for call in range(CALLS):
        x, y = corpus.batches("train", STEPS_PER_CALL, BATCH, config["block_size"], (0, call))
        losses = executor.run(x, y)
        with on_cpu():
            jax_params, jax_opt, jax_losses = program.jax_step(jax_params, jax_opt, x, y)
        np.testing.assert_allclose(losses, np.asarray(jax_losses), rtol=rtol)
        all_losses += [float(v) for v in losses]
    for spec, ours, theirs in zip(program.param_specs, executor.params(), jax_params, strict=True):
        theirs = np.asarray(theirs)
        assert np.all(np.isfinite(ours)), f"{spec.name} is not finite"
        if spec.name in unstable:
            continue
        error = np.linalg.norm(ours - theirs) / max(float(np.linalg.norm(theirs)), 1e-12)
        assert error < rtol, f"{spec.name}: relative error {error:.2e}"
    return all_losses
