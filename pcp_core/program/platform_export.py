"""The step exported for one platform's jax (the artifact pcp-xla ships), and the forms
the model takes there.

The portable program, the StableHLO that IREE compiles and `TrainProgram.jax_step`, is
traced for no platform. A step exported for a platform is traced anew inside
`exporting_for`, so the model stays one definition and reads `export_platform` to
choose per platform. The export for CUDA takes the forms that XLA compiles well on
NVIDIA GPUs where IREE needs others (`xla_on_cuda`); every other platform's export
keeps the portable forms. docs/gpu.md says what each form buys.
"""

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

from pcp_core.program.mesh import export_mesh, exported_on, placed_on

# The platform whose exported step takes the XLA forms (see `xla_on_cuda`). Tests set
# the CPU's here, to check those forms against the portable program without a GPU.
XLA_FORMS_PLATFORM = "cuda"
# The platform a program is being exported for while its step is traced (see
# `export_platform`); None while the portable program is traced.
_EXPORT_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "pcp_export_platform", default=None
)
# Custom calls that a program exported for a platform may hold although jax does not
# promise them stable across versions: cuDNN's fused attention (see nanogpt's
# `_attention`). Both ends run the same jax on that platform (see pcp-xla's join check).
PLATFORM_CUSTOM_CALLS = {
    "cuda": ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"),
}


def export_platform() -> str | None:
    """The jax platform ("cuda", "cpu", ...) the step being traced is exported for, or
    None for the portable program."""
    return _EXPORT_PLATFORM.get()


def xla_on_cuda() -> bool:
    """Whether the step being traced is exported for XLA on CUDA, and so takes the forms
    XLA compiles well there rather than those IREE needs.

    They compute the same function of the same parameters: with no scatters and no
    atomics, so that a step gives the same bits each time (the conformance suite checks
    it), and, in `bf16`, with activations rounded where torch.autocast rounds them. Each
    form's own docstring says why XLA runs it better; docs/gpu.md has the measurements.
    """
    return export_platform() == XLA_FORMS_PLATFORM


@contextlib.contextmanager
def exporting_for(platform: str | None, devices: int = 1) -> Iterator[None]:
    """Trace inside this block as `TrainProgram.export(platform, devices)` does (see
    `export_platform` and `pcp_core.program.mesh.export_mesh`)."""
    token = _EXPORT_PLATFORM.set(platform)
    try:
        with exported_on(platform, devices):
            yield
    finally:
        _EXPORT_PLATFORM.reset(token)


def export_step(
    step: Callable,
    arguments: tuple[Any, ...],
    opt_shapes: list[tuple[int, ...]],
    precision: str,
    platform: str,
    devices: int = 1,
) -> Any:
    """`step` of `arguments` (params, optimizer state, inputs, targets) traced for
    `platform` and exported as a `jax.export.Exported`, float32 products at full
    precision as IREE computes them. On a mesh of `devices` the batch axis is split over
    them and the parameters replicated on each, so XLA sums the gradients across devices
    (NCCL on NVIDIA GPUs) and every device ends the step with the same parameters; each
    optimizer-state tensor (of `opt_shapes`) is split over the devices along its first
    axis that divides evenly (ZeRO stage 1: each device keeps and updates a part of
    AdamW's moments), else replicated (`pcp_core.program.mesh`)."""
    import jax

    batch = arguments[2].shape[1]
    if devices < 1 or batch % devices:
        raise ValueError(
            f"a batch of {batch} sequences does not split evenly over "
            f"{devices} devices: make the batch size a multiple of {devices}"
        )

    def step_for_platform(*args: Any) -> Any:
        # a function of its own, so jax traces it anew rather than reuse the portable
        # trace of the step: the model may choose per platform here
        return step(*args)

    allowed = [
        jax.export.DisabledSafetyCheck.custom_call(target)
        for target in PLATFORM_CUSTOM_CALLS.get(platform, ())
    ]
    with (
        exporting_for(platform, devices),
        jax.default_matmul_precision("highest" if precision == "f32" else None),
    ):
        jitted = jax.jit(step_for_platform, **placed_on(export_mesh(), opt_shapes))
        return jax.export.export(jitted, platforms=(platform,), disabled_checks=allowed)(*arguments)
