"""Checking that an IREE executor keeps the training state on the device.

`DeviceArray.is_host_accessible` only says whether that one object was mapped, so an
executor that copied its whole state through the host on every call still passed a
check built on it: the copies were new, never-mapped arrays. This module watches the
IREE runtime itself instead, below any executor: every call of a compiled program (its
argument and result buffers), and every way Python reaches device memory (mapping a
buffer, copying host memory into a new one, importing host memory, DLPack). State that
stays on the device shows in both: each call is given the previous call's result
buffers themselves, and a run moves about its batch and its losses through the host,
not the parameters.
"""

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any
from unittest.mock import patch

import numpy as np

# What a run may move through the host beyond its batch and losses: a staging buffer
# rounded up to an allocation granule, say. The reference state is hundreds of KiB.
SLACK_BYTES = 4096

# The bytes a runtime call moves, from (self and its arguments, keyword arguments, result).
Size = Callable[[tuple, dict, Any], int]


@dataclass
class Transfers:
    """What crossed between host and device, and the program calls, while watched."""

    host_bytes: int = 0
    events: list[tuple[str, int]] = field(default_factory=list)
    calls: list[tuple[Any, Any]] = field(default_factory=list)  # (arguments, results)

    def since(self, start: int) -> str:
        """The transfers after event `start`, summed by entry point, for a message."""
        totals: dict[str, int] = {}
        for name, size in self.events[start:]:
            totals[name] = totals.get(name, 0) + size
        return ", ".join(f"{name} {size} B" for name, size in totals.items()) or "none"


def _nbytes(host_object: Any) -> int:
    try:
        return memoryview(host_object).nbytes
    except TypeError:
        return int(np.asarray(host_object).nbytes)


def _argument(args: tuple, kwargs: dict, position: int, name: str) -> Any:
    return kwargs[name] if name in kwargs else args[position]


def _traced_view_bytes(variants: Any, index: int) -> int:
    import iree.runtime as rt

    try:
        return variants.get_as_object(index, rt.HalBufferView).byte_length
    except (TypeError, ValueError, RuntimeError):
        return 0


@contextmanager
def watch_transfers() -> Iterator[Transfers]:
    """Count host<->device bytes and record program calls, for every executor at once.

    The IREE runtime's classes are patched for the duration, so an executor cannot
    route around the count by calling the runtime some other way from Python. Not
    seen: the runtime's own upload of host arrays passed straight to a program call;
    those arrive as new argument buffers, which `assert_state_stays_on_device` catches.
    """
    import iree.runtime as rt

    seen = Transfers()
    entry_points: list[tuple[type, str, Size]] = [
        (rt.HalBuffer, "map", lambda a, k, r: a[0].byte_length()),
        (rt.HalBufferView, "map", lambda a, k, r: a[0].byte_length),
        (
            rt.HalAllocator,
            "allocate_buffer_copy",
            lambda a, k, r: _nbytes(_argument(a, k, 4, "buffer")),
        ),
        (
            rt.HalAllocator,
            "allocate_host_staging_buffer_copy",
            lambda a, k, r: _nbytes(_argument(a, k, 2, "initial_contents")),
        ),
        (
            rt.HalAllocator,
            "import_host_allocation",
            lambda a, k, r: _nbytes(_argument(a, k, 1, "buffer_obj")),
        ),
        (
            rt.HalDevice,
            "create_dlpack_capsule",
            lambda a, k, r: _argument(a, k, 1, "buffer_view").byte_length,
        ),
        (rt.HalDevice, "from_dlpack_capsule", lambda a, k, r: r.byte_length),
        (
            rt.VmVariantList,
            "get_serialized_trace_value",
            lambda a, k, r: _traced_view_bytes(a[0], _argument(a, k, 1, "index")),
        ),
    ]

    def counting(cls: type, name: str, size: Size) -> Callable[..., Any]:
        original = getattr(cls, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            nbytes = size(args, kwargs, result)
            seen.events.append((f"{cls.__name__}.{name}", nbytes))
            seen.host_bytes += nbytes
            return result

        return counted

    original_invoke = rt.VmContext.invoke

    def invoke(context: Any, function: Any, arguments: Any, results: Any) -> None:
        original_invoke(context, function, arguments, results)
        seen.calls.append((arguments, results))

    with ExitStack() as patches:
        for cls, name, size in entry_points:
            patches.enter_context(patch.object(cls, name, counting(cls, name, size)))
        patches.enter_context(patch.object(rt.VmContext, "invoke", invoke))
        yield seen


def assert_state_stays_on_device(executor: Any, batches: Iterable[tuple[Any, Any]]) -> None:
    """Run `executor` on each (inputs, targets) and fail if its state left the device.

    Two things must hold. Each call of the compiled program is given, as parameters and
    optimizer state, the very buffers the previous call returned: a copy through the
    host and back makes new ones. And a run moves through the host no more than its
    batch and its losses (plus SLACK_BYTES): reading the state back each call counts.
    Give it at least two batches, and an executor whose state is already set.
    """
    import iree.runtime as rt

    specs = [*executor.param_specs, *executor.opt_specs]
    with watch_transfers() as seen:
        for number, (inputs, targets) in enumerate(batches, 1):
            start, before = len(seen.events), seen.host_bytes
            losses = np.asarray(executor.run(inputs, targets))
            moved = seen.host_bytes - before
            allowed = inputs.nbytes + targets.nbytes + losses.nbytes + SLACK_BYTES
            assert moved <= allowed, (
                f"run {number} moved {moved} bytes between host and device "
                f"({seen.since(start)}), more than its batch and losses ({allowed}): "
                "the training state went through the host"
            )
    assert len(seen.calls) >= 2, f"{len(seen.calls)} program call(s) seen; need two to compare"
    for number, ((_, returned), (given, _)) in enumerate(pairwise(seen.calls), 2):
        for index, spec in enumerate(specs):
            out = returned.get_as_object(index, rt.HalBufferView).get_buffer()
            into = given.get_as_object(index, rt.HalBufferView).get_buffer()
            assert out == into, (
                f"program call {number} was not given the {spec.name} buffer that call "
                f"{number - 1} returned: the training state was copied between calls"
            )
