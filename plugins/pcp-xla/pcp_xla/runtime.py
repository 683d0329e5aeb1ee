"""The XLA runtime: build a `jax.export` artifact, check a worker's jax can run it, run it.

The artifact is `TrainProgram.export(platform)` serialized (a few hundred KB for
gpt-b32, against a few MB of VMFB). jax does not check versions when it deserializes,
so the join does: the worker reports its platform, the calling conventions its jax
runs and the newest StableHLO it reads; the shepherd refuses it if its own artifacts
fall outside them. On the worker an `XlaExecutor` (`pcp_xla.executor`) runs the step.

One worker may drive several devices of its machine (`pcp worker --devices all`): the
shepherd exports the step for a mesh of that many devices, the batch split over them,
the parameters whole on each and the optimizer state split (`TrainProgram.export`), and
XLA sums the gradients across them. The shepherd still sees one worker, sending one
result a round.
"""

import functools
import hashlib
import re
from typing import Any

import numpy as np

from pcp_core.backends import (
    Artifact,
    Backend,
    CompileError,
    DeviceChoice,
    DeviceError,
    DeviceReport,
    device_indices,
)
from pcp_core.program.platform_export import PLATFORM_CUSTOM_CALLS
from pcp_xla.executor import XlaExecutor

KIND = "xla-export"
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # what jax.export lowers for


def detect_platform(device: int = 0) -> str | None:
    """The platform this machine's jaxlib runs on: cpu, cuda, rocm or tpu."""
    import jax

    return jax.export.default_export_platform()


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@functools.cache
def _exported_versions() -> tuple[int, tuple[int, ...]]:
    """The calling convention and StableHLO version of what this jax exports."""
    import jax

    probe = jax.export.export(jax.jit(lambda x: x + 1))(jax.ShapeDtypeStruct((1,), np.float32))
    found = re.search(rb"StableHLO_v([\d.]+)", probe.mlir_module_serialized)
    return probe.calling_convention_version, _version(found.group(1).decode()) if found else ()


def _readable_stablehlo() -> str | None:
    """The newest StableHLO version this jax reads (None if it cannot tell)."""
    try:
        from jax._src.lib.mlir.dialects import hlo

        return str(hlo.get_current_version())
    except (ImportError, AttributeError):
        return None


def _devices() -> list[Any]:
    import jax

    try:
        return jax.devices()
    except RuntimeError as error:
        raise DeviceError(f"jax found no usable device ({str(error).splitlines()[0]})") from None


class XlaRuntime:
    kind = KIND
    host_memory = False  # a GPU's, or jaxlib's own pool on the CPU: not checked
    multi_device = True  # one worker may train data-parallel on several devices

    def build(self, program: Any, backend: Backend, arch: str, devices: int = 1) -> Artifact:
        if arch not in PLATFORMS:
            raise CompileError(
                f"xla builds for a jaxlib platform ({', '.join(PLATFORMS)}), not {arch!r}"
            )
        try:
            data = bytes(program.export(arch, devices).serialize())
        except (ValueError, NotImplementedError) as error:
            raise CompileError(f"jax could not export the step for {arch}: {error}") from None
        return Artifact(self.kind, data, hashlib.sha256(data).hexdigest(), backend.name, arch)

    def worker_report(self, backend: Backend) -> dict[str, Any]:
        import jax

        return {
            "jax": jax.__version__,
            "platform": jax.export.default_export_platform(),
            "calling_conventions": [
                jax.export.minimum_supported_calling_convention_version,
                jax.export.maximum_supported_calling_convention_version,
            ],
            "stablehlo": _readable_stablehlo(),
        }

    def refusal(self, backend: Backend, arch: str, report: dict[str, Any]) -> str | None:
        import jax

        theirs = f"this worker's jax {report.get('jax')}"
        if report.get("platform") != arch:
            return f"{theirs} runs on {report.get('platform')!r}, not on {arch!r}"
        convention, stablehlo = _exported_versions()
        lowest, highest = report.get("calling_conventions") or (None, None)
        if not (isinstance(lowest, int) and isinstance(highest, int)):
            return f"{theirs} did not say which calling conventions it runs"
        if not lowest <= convention <= highest:
            return (
                f"the shepherd's jax {jax.__version__} exports calling convention "
                f"{convention}; {theirs} runs {lowest}..{highest}: install jax=={jax.__version__}"
            )
        if PLATFORM_CUSTOM_CALLS.get(arch) and report.get("jax") != jax.__version__:
            return (
                f"the shepherd's {arch} program may call cuDNN's fused attention, whose "
                f"interface jax keeps for one version only; {theirs} is not the shepherd's "
                f"{jax.__version__}: install jax=={jax.__version__}"
            )
        readable = report.get("stablehlo")
        if readable and stablehlo > _version(str(readable)):
            return (
                f"the shepherd's jax {jax.__version__} writes StableHLO "
                f"{'.'.join(map(str, stablehlo))}; {theirs} reads up to {readable}"
            )
        return None

    def require_device(self, backend: Backend, device: DeviceChoice) -> None:
        devices = _devices()
        for index in device_indices(device):
            if not 0 <= index < len(devices):
                platform = devices[0].platform if devices else "no"
                raise DeviceError(
                    f"jax sees {len(devices)} {platform} device(s); no device {index}"
                )

    def describe_devices(self, backend: Backend) -> DeviceReport:
        try:
            found, note = _devices(), ""
        except DeviceError as error:
            found, note = [], str(error)
        return DeviceReport(
            backend=backend.name,
            runtime="xla pjrt",
            available=bool(found),
            devices=[f"{i}: {d.device_kind}" for i, d in enumerate(found)],
            arch=backend.resolve_arch(),
            note=note,
        )

    def open(self, artifact: bytes, backend: Backend, program: Any, device: DeviceChoice) -> Any:
        self.require_device(backend, device)
        return XlaExecutor(artifact, program.param_specs, program.opt_specs, device)

    def assert_state_stays_on_device(self, executor: Any, batches: list[Any]) -> None:
        """Each call donates the state the last call returned (so it is written over on
        the device, not copied), and returns only the losses, as a host array."""
        import jax

        for inputs, targets in batches:
            before = executor.device_state()
            assert all(isinstance(a, jax.Array) for a in before), "state not on the device"
            losses = executor.run(inputs, targets)
            assert isinstance(losses, np.ndarray) and losses.shape == (len(inputs),)
            assert all(a.is_deleted() for a in before), "the state was copied, not donated"
            assert executor.holds_its_state(), "state left the device"


XLA = XlaRuntime()
