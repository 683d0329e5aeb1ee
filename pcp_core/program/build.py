"""Building the training program: K inner steps of model + inner optimizer, as StableHLO.

Parameters and optimizer state are explicit inputs and outputs, in a fixed named
order, so the compiled program can keep them on the device between calls and both
ends of a wire agree on what each tensor is.
"""

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from pcp_core.models import Model
from pcp_core.optimizers import GradientTransformation
from pcp_core.program import export_cache
from pcp_core.program.platform_export import export_step
from pcp_core.program.train_step import accumulated, k_steps, opt_state_init

ENTRY_FUNCTION = "main"
# The optimizer-state tensor of a program that carries its learning-rate schedule
# (`build_train_program`'s `schedule`): [lr, min_lr, warmup steps, total steps].
SCHEDULE_TENSOR = "opt.lr_schedule"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def conforming(arrays: list[Any], specs: list[TensorSpec]) -> list[np.ndarray]:
    """`arrays` as C-contiguous arrays of their specs' dtypes; ValueError naming the
    tensor if there are too few or too many, or one has another shape. What every
    executor checks before it puts state on its device."""
    if len(arrays) != len(specs):
        raise ValueError(f"expected {len(specs)} tensors, got {len(arrays)}")
    checked = []
    for array, spec in zip(arrays, specs, strict=True):
        array = np.asarray(array, dtype=spec.dtype, order="C")
        if array.shape != spec.shape:
            raise ValueError(f"{spec.name}: shape {array.shape}, expected {spec.shape}")
        checked.append(array)
    return checked


@dataclass
class TrainProgram:
    """The exported program plus what callers need to feed it."""

    stablehlo: str  # the K steps of a call as a loop
    param_specs: list[TensorSpec]
    opt_specs: list[TensorSpec]
    steps_per_call: int
    batch_size: int
    block_size: int
    jax_step: Callable[..., Any]  # the same step jitted by XLA, for parity and benchmarks
    # The step as a jax.export.Exported for one platform ("cpu", "cuda", ...) and a
    # number of devices it runs on data-parallel, float32 products at full precision as
    # IREE computes them (`platform_export.export_step`; pcp-xla ships it serialized).
    export: Callable[[str, int], Any]
    init_opt_state: Callable[[list[np.ndarray]], list[np.ndarray]]
    # The same K steps straight-line, exported on first use (see `stablehlo_for`).
    unrolled: Callable[[], str] | None = None

    def stablehlo_for(self, unrolled: bool) -> str:
        """The StableHLO an IREE backend compiles: the loop, or with `unrolled` (a
        backend's `Backend.unroll_steps`) the steps straight-line, where there are any."""
        return self.unrolled() if unrolled and self.unrolled is not None else self.stablehlo

    @property
    def parameter_count(self) -> int:
        return sum(int(np.prod(s.shape, dtype=np.int64)) for s in self.param_specs)

    def opt_field_names(self, field: str) -> list[str]:
        """The optimizer-state tensors under `field` of the state, by name ("opt" and
        their path in the state: `opt.mu['wte']` is under `mu`)."""
        prefix = f"opt.{field}"
        return [
            spec.name
            for spec in self.opt_specs
            if spec.name == prefix or spec.name.startswith((f"{prefix}[", f"{prefix}."))
        ]


def without_locations(stablehlo: str) -> str:
    """The module re-printed without debug locations.

    JAX records the caller's file and line for every op; left in, they would make the
    compile-cache key (and so every cached VMFB) depend on where the program was
    built from rather than on what it computes.
    """
    from jax.interpreters import mlir

    with mlir.make_ir_context():
        module = mlir.ir.Module.parse(stablehlo)
        return cast(str, module.operation.get_asm(enable_debug_info=False))  # binary=False


def specs_of(named: Mapping[str, Any]) -> list[TensorSpec]:
    return [
        TensorSpec(n, tuple(int(d) for d in a.shape), np.dtype(a.dtype).name)
        for n, a in named.items()
    ]


def build_train_program(
    model: Model,
    model_config: Mapping[str, int],
    optimizer: GradientTransformation,
    steps_per_call: int,
    batch_size: int,
    seed: int = 0,
    precision: str = "f32",
    identity: Mapping[str, Any] | None = None,
    schedule: np.ndarray | None = None,
    micro_batches: int = 1,
) -> TrainProgram:
    """Trace and export `steps_per_call` train steps over a [K, batch, block] stack.

    With `micro_batches` M over 1 (`--grad-accum`) a step's batch is M micro-batches of
    batch / M, whose gradients are computed one after another and averaged: the mean
    over the whole batch, with one micro-batch's activations in memory.

    `precision` (see `pcp_core.program.precision`) is the model's compute precision; the
    parameters, optimizer state and losses are float32 whatever it is. With `identity`
    (`export_cache.identity` of the model, optimizer and settings given here) the
    StableHLO comes from the export cache where it holds this program.

    With `schedule` (`pcp_core.optimizers.schedule_values`) the learning-rate schedule is
    state, not constants: the last optimizer-state tensor (`SCHEDULE_TENSOR`), set from
    `schedule` by `init_opt_state`, read by `learning_rate`'s schedules. The program is
    then the same whatever the run's length, rate or warmup, and so is its compile: a
    new `--steps` compiles nothing (the tests' CI compiled 117 programs for 53 distinct
    ones). An optimizer with a schedule of its own keeps it as constants.
    """
    import jax

    model.check_precision(precision)
    example = model.init(model_config, seed)
    names = list(example)
    loss_of = _loss_of(model, model_config, precision)
    opt_specs, opt_treedef = _opt_layout(jax.eval_shape(optimizer.init, example))
    if batch_size % micro_batches:
        raise ValueError(f"a batch of {batch_size} does not split into {micro_batches} parts")
    if identity is not None and micro_batches > 1:
        identity = {**identity, "micro_batches": micro_batches}
    gradient = accumulated(loss_of, micro_batches)
    carried = () if schedule is None else (TensorSpec(SCHEDULE_TENSOR, schedule.shape, "float32"),)
    train_step = k_steps(names, len(opt_specs), opt_treedef, optimizer, gradient)
    return _exported(
        train_step,
        specs_of(example),
        [*opt_specs, *carried],
        (steps_per_call, batch_size, model_config["block_size"]),
        precision,
        identity,
        init_opt_state=opt_state_init(names, optimizer, schedule),
        # The K steps unrolled, for the IREE backends that ask for it
        # (`Backend.unroll_steps`). As a loop, on a GPU each pass copies every parameter
        # and moment into the loop's buffers and records the step's command buffer anew;
        # straight-line, the whole call is one command buffer that IREE records once and
        # replays with each call's buffers (docs/iree-cuda.md). It compiles several times
        # slower, so the CPU and XLA keep the loop. Both compute the same steps, op for op.
        unrolled_step=functools.partial(train_step, unroll=True),
    )


def _opt_layout(opt_shapes: Any) -> tuple[list[TensorSpec], Any]:
    """The optimizer state's tensors, named by their path, and its tree to rebuild it."""
    import jax

    opt_paths, opt_treedef = jax.tree_util.tree_flatten_with_path(opt_shapes)
    opt_specs = [
        TensorSpec("opt" + jax.tree_util.keystr(path), tuple(leaf.shape), np.dtype(leaf.dtype).name)
        for path, leaf in opt_paths
    ]
    return opt_specs, opt_treedef


def build_eval_program(
    model: Model,
    model_config: Mapping[str, int],
    batches: int,
    batch_size: int,
    seed: int = 0,
    precision: str = "f32",
    identity: Mapping[str, Any] | None = None,
) -> TrainProgram:
    """The loss of each of `batches` batches, exported like a train program whose step
    changes nothing: the parameters come back as they went in, there is no optimizer
    state, and the "losses" are one per batch. So every runtime builds and runs it as it
    does training, and validation runs on a backend's device, not in JAX on the host.
    `identity`: as for `build_train_program`.
    """
    import jax

    model.check_precision(precision)
    example = model.init(model_config, seed)
    names = list(example)
    loss_of = _loss_of(model, model_config, precision)

    def eval_step(params_tuple, opt_tuple, inputs, targets):
        params = dict(zip(names, params_tuple, strict=True))
        losses = jax.lax.map(lambda batch: loss_of(params, *batch), (inputs, targets))
        return params_tuple, opt_tuple, losses

    return _exported(
        eval_step,
        specs_of(example),
        [],
        (batches, batch_size, model_config["block_size"]),
        precision,
        identity,
        init_opt_state=lambda params: [],
    )


def _loss_of(model: Model, model_config: Mapping[str, int], precision: str) -> Callable:
    options = {} if precision == "f32" else {"precision": precision}

    def loss_of(params: dict[str, Any], x: Any, y: Any) -> Any:
        return model.loss(model_config, params, x, y, **options)

    return loss_of


def _exported(
    step: Callable,
    param_specs: list[TensorSpec],
    opt_specs: list[TensorSpec],
    batch_shape: tuple[int, int, int],
    precision: str,
    identity: Mapping[str, Any] | None,
    init_opt_state: Callable[[list[np.ndarray]], list[np.ndarray]],
    unrolled_step: Callable | None = None,
) -> TrainProgram:
    """`step(params, opt_state, inputs, targets)` jitted and exported for [K, batch,
    block] token stacks; `unrolled_step`, the same computation without the loop, is
    exported when a backend first asks for it. Both texts go through the export cache
    where there is an `identity`."""
    import jax
    import jax.numpy as jnp

    shapes = {"step": step.__qualname__, "params": param_specs, "opt": opt_specs}
    shapes |= {"batch": batch_shape, "precision": precision}

    def cached(form: str, export: Callable[[], str]) -> str:
        key_parts = None if identity is None else {**identity, **shapes, "form": form}
        return export_cache.stablehlo(key_parts, export)

    def abstract(specs: list[TensorSpec]) -> tuple[Any, ...]:
        return tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in specs)

    arguments = (
        abstract(param_specs),
        abstract(opt_specs),
        jax.ShapeDtypeStruct(batch_shape, jnp.int32),
        jax.ShapeDtypeStruct(batch_shape, jnp.int32),
    )
    jitted = jax.jit(step)

    def exported(function: "jax.stages.Wrapped") -> Callable[[], str]:
        return lambda: without_locations(jax.export.export(function)(*arguments).mlir_module())

    @functools.cache
    def unrolled() -> str:
        assert unrolled_step is not None  # asked for only where there is one
        return cached("unrolled", exported(jax.jit(unrolled_step)))

    steps_per_call, batch_size, block_size = batch_shape
    return TrainProgram(
        stablehlo=cached("loop", exported(jitted)),
        param_specs=param_specs,
        opt_specs=opt_specs,
        steps_per_call=steps_per_call,
        batch_size=batch_size,
        block_size=block_size,
        jax_step=jitted,
        export=functools.partial(
            export_step, step, arguments, [s.shape for s in opt_specs], precision
        ),
        init_opt_state=init_opt_state,
        unrolled=unrolled if unrolled_step is not None else None,
    )
