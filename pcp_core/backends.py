"""What a hardware backend is: a runtime, with an IREE compile target and driver where
that runtime is IREE.

IREE backend plugins are thin descriptions naming the core's IREE runtime
(`pcp_core.iree.runtime.IREE`), which compiles, loads and runs them. A backend that is
not IREE (pcp-xla) names a `Runtime` of its own:
how its artifact is built from the exported program, what a worker reports and the
shepherd checks at the join, how its device is found and its artifact run.
"""

import inspect
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import structlog

from pcp_core.config import PRECISIONS

log = structlog.get_logger(__name__)

# `detect_arch(device)`: the architecture of device index `device` (0 is the first, as
# `--device` counts), or None when it cannot tell. The zero-argument form that backends
# wrote before detection took a device is still called: it speaks for every device.
DetectArch = Callable[[int], str | None] | Callable[[], str | None]


# The devices a worker drives: one device index, several (a runtime whose
# `multi_device` is True trains on them data-parallel), or None for the first.
DeviceChoice = int | tuple[int, ...] | None
MAX_DEVICES = 1024  # more devices than one machine has; a bound for what a worker claims


def device_indices(device: DeviceChoice) -> tuple[int, ...]:
    """The device indices of a choice: None is the first device."""
    if device is None:
        return (0,)
    return (device,) if isinstance(device, int) else tuple(device)


def device_label(device: DeviceChoice) -> str:
    """The choice as a worker names it in its Hello and its state directory: "0", "0,1"."""
    return ",".join(map(str, device_indices(device)))


def devices_in_label(label: str) -> int:
    """How many devices a worker's Hello names ("" is one: a worker older than
    multi-device workers); ValueError for anything but distinct indices."""
    parts = label.split(",") if label else ["0"]
    if not all(p.isdigit() and int(p) < MAX_DEVICES for p in parts) or len(set(parts)) < len(parts):
        raise ValueError(f"its device list {label[:80]!r} is not distinct device indices")
    return len(parts)


def parse_devices(text: str, available: int) -> tuple[int, ...]:
    """`--devices` as indices: "all" (the `available` devices) or a comma-separated
    list such as "0,1"; ValueError, one line, for anything else."""
    if text.strip() == "all":
        if available < 1:
            raise ValueError("--devices all: no device found")
        return tuple(range(available))
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"--devices must be 'all' or device indices such as 0,1; got {text!r}")
    indices = tuple(int(p) for p in parts)
    if len(set(indices)) < len(indices):
        raise ValueError(f"--devices {text}: a device is named twice")
    if missing := [i for i in indices if i >= available]:
        has = "only device 0" if available == 1 else f"{available}: 0 to {available - 1}"
        raise ValueError(f"--devices {text}: no device {missing[0]} (this machine has {has})")
    return indices


def multi_device(backend: "Backend") -> bool:
    """Whether one worker of `backend` may drive several devices (its runtime says so)."""
    return bool(getattr(backend.runtime, "multi_device", False))


class CompileError(RuntimeError):
    """A runtime could not build the program for a target."""


class DeviceError(RuntimeError):
    """The runtime or the requested device is not available."""


@dataclass(frozen=True)
class Artifact:
    """A program built for one backend and architecture: what the shepherd ships."""

    kind: str  # the runtime's kind: "iree-vmfb", "xla-export"
    data: bytes
    sha256: str
    backend: str
    arch: str
    cache_hit: bool = False


@dataclass(frozen=True)
class DeviceReport:
    """What `pcp devices` shows for one backend: is its runtime here, which devices it
    sees, and the architecture PCP would compile for."""

    backend: str
    runtime: str  # the runtime and its driver, e.g. "iree local-task", "xla pjrt"
    available: bool
    devices: list[str]
    arch: str
    note: str = ""  # why none is available: what to install


class Executor(Protocol):
    """One built program loaded on one device, holding the training state there between
    calls; only the losses come back from `run`. Its specs name the tensors that
    `params` and `opt_state` hold, in order."""

    param_specs: list[Any]  # pcp_core.program.build.TensorSpec
    opt_specs: list[Any]

    def set_params(self, params: list[Any]) -> None: ...

    def set_opt_state(self, opt_state: list[Any]) -> None: ...

    def run(self, inputs: Any, targets: Any) -> Any: ...

    def params(self) -> list[Any]: ...

    def opt_state(self) -> list[Any]: ...

    # Optional: `fill_opt_tensors(values)` fills the named optimizer-state tensors with a
    # value each on the device and keeps the rest; see set_opt_tensors below.
    # Optional: `dispatch(inputs, targets)` starts a call and returns at once a function
    # that waits for its losses; see dispatch below.


def dispatch(executor: Executor, inputs: Any, targets: Any) -> Callable[[], np.ndarray]:
    """Start a call of `executor`; the returned function waits for its losses. An
    executor that runs asynchronously (its `dispatch`: XLA on a GPU) computes while the
    host prepares the next call, so the device does not idle between short calls (an
    H200's step of the shakespeare-char model: 15.2 ms with one step a call, waited for
    each time, 12.3 ms with ten); the others run the call now."""
    start = getattr(executor, "dispatch", None)
    if start is not None:
        return start(inputs, targets)
    losses = np.asarray(executor.run(inputs, targets))
    return lambda: losses


def set_opt_tensors(executor: Executor, values: dict[str, float]) -> None:
    """Fill the named optimizer-state tensors with a value each, the rest as they were:
    on the device where the executor can (its `fill_opt_tensors`), else by reading the
    state back and writing it again whole, a round trip of the whole state (a GPT of
    10.8M parameters: 82 MB each way, at every budgeted round's start)."""
    in_place = getattr(executor, "fill_opt_tensors", None)
    if in_place is not None:
        in_place(values)
    else:
        set_opt_tensors_through_host(executor, values)


def set_opt_tensors_through_host(executor: Executor, values: dict[str, float]) -> None:
    """set_opt_tensors for any executor: the state read back and written again whole."""
    executor.set_opt_state(
        [
            np.full_like(state, values[spec.name]) if spec.name in values else state
            for spec, state in zip(executor.opt_specs, executor.opt_state(), strict=True)
        ]
    )


def zero_opt_tensors(executor: Executor, names: set[str]) -> None:
    """Zero the named optimizer-state tensors (`set_opt_tensors`)."""
    set_opt_tensors(executor, dict.fromkeys(names, 0.0))


class Runtime(Protocol):
    """How a backend's programs are built, admitted and run."""

    @property
    def kind(self) -> str: ...  # of the artifacts it builds and opens

    # Whether its device memory is this machine's memory (IREE on the CPU), so that a
    # run's memory check counts each local training process against it.
    @property
    def host_memory(self) -> bool: ...

    def build(self, program: Any, backend: "Backend", arch: str) -> Artifact:
        """The artifact for `arch` from a `pcp_core.program.build.TrainProgram` (on the
        shepherd). A runtime with `multi_device = True` also takes `devices`, the number
        of devices the worker trains on, and builds the program for that many."""
        ...

    def worker_report(self, backend: "Backend") -> dict[str, Any]:
        """What a worker says about its runtime in its Hello (versions, platform)."""
        ...

    def refusal(self, backend: "Backend", arch: str, report: dict[str, Any]) -> str | None:
        """Why the shepherd cannot serve a worker that reported `report`, or None."""
        ...

    def require_device(self, backend: "Backend", device: int | None) -> None:
        """DeviceError, one line saying what to install, unless the device is here."""
        ...

    def describe_devices(self, backend: "Backend") -> DeviceReport:
        """What `pcp devices` shows for the backend."""
        ...

    def open(
        self, artifact: bytes, backend: "Backend", program: Any, device: int | None
    ) -> Executor:
        """An executor for `artifact` on device index `device` (default the first), or on
        a tuple of indices where the runtime is `multi_device`. `program` holds
        `param_specs` and `opt_specs`."""
        ...

    def assert_state_stays_on_device(self, executor: Executor, batches: list[Any]) -> None:
        """For the conformance suite: AssertionError if state crosses to the host."""
        ...


class MultiDeviceRuntime(Runtime, Protocol):
    """A runtime with `multi_device = True`: it builds for, and opens on, several devices."""

    def build(self, program: Any, backend: "Backend", arch: str, devices: int = 1) -> Artifact: ...

    def open(
        self, artifact: bytes, backend: "Backend", program: Any, device: DeviceChoice
    ) -> Executor: ...


@dataclass(frozen=True)
class Backend:
    """One kind of device PCP can compile for and run on, and the runtime that does it:
    `pcp_core.iree.runtime.IreeRuntime(target=..., driver=...)` for an IREE backend."""

    name: str
    runtime: Runtime = field(compare=False)
    default_arch: str  # used when detection is impossible
    description: str = ""
    # The run precisions (pcp_core.program.precision) it compiles.
    precisions: tuple[str, ...] = PRECISIONS
    # What to install when the runtime or device is missing (one line).
    install_hint: str = ""
    # The architecture of a local device (see DetectArch), or None when it cannot tell.
    detect_arch: DetectArch | None = field(default=None, compare=False)
    # (precision, why) of precisions it compiles but runs far slower than f32: a run in
    # one is warned once at its start
    slow_precisions: tuple[tuple[str, str], ...] = ()

    def resolve_arch(self, requested: str | None = None, device: int | None = None) -> str:
        """The requested architecture, else the one detected for device index `device`
        (default the first), else the known-good default."""
        if requested:
            return requested
        detected = None
        if self.detect_arch is not None and takes_device(self.detect_arch):
            detected = self.detect_arch(device or 0)  # type: ignore[call-arg]
        elif self.detect_arch is not None:
            if device:
                log.warning(
                    "this backend detects one architecture for all its devices, maybe "
                    "another device's: pass --target to be sure",
                    backend=self.name,
                    device=device,
                )
            detected = self.detect_arch()  # type: ignore[call-arg]
        return detected or self.default_arch

    def check_precision(self, precision: str) -> None:
        if precision not in self.precisions:
            raise ValueError(
                f"backend {self.name!r} cannot train in {precision} "
                f"(it supports {', '.join(self.precisions)})"
            )

    def warn_if_slow(self, precision: str) -> None:
        """One warning where `precision` is one it runs far slower than f32."""
        why = dict(self.slow_precisions).get(precision)
        if why is not None:
            log.warning(f"--precision {precision} on {self.name} runs far slower than f32: {why}")


def takes_device(detect: Callable[..., str | None]) -> bool:
    """Whether a detect_arch accepts a device index (the zero-argument form does not)."""
    try:
        inspect.signature(detect).bind(0)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): assume the current form
        return True
    return True


def run_quietly(command: list[str], timeout_s: float = 20.0) -> str:
    """A tool's standard output, or "" when it is missing, fails or hangs."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def iree_device_dump(driver: str) -> list[dict[str, str]]:
    """The devices IREE's runtime sees for `driver`, as the `key: value` pairs it prints.

    `iree-run-module --dump_devices` knows more than the Python API exposes (Vulkan
    device type, vendor and subgroup size; CUDA compute capability). It runs in a child
    process so a broken driver cannot take this one down.
    """
    module = "iree._runtime.scripts.iree_run_module"
    text = run_quietly([sys.executable, "-m", module, f"--dump_devices={driver}"])
    devices: list[dict[str, str]] = []
    for line in text.splitlines():
        if line.startswith("# --device="):
            devices.append({})
        elif devices and ": " in line and not line.startswith((" ", "#")):
            key, value = line.split(": ", 1)
            # CUDA and HIP print "- gpu-compute-capability: 9.0", Vulkan "type: cpu"
            devices[-1].setdefault(key.strip().removeprefix("- "), value.strip())
    return devices


# `pcp worker --backend auto` takes the first of these that is installed and finds a
# device: XLA where it sees a GPU (the fastest PCP runs on NVIDIA), the IREE GPU
# backends, Vulkan on real hardware, then the CPU
AUTO_ORDER = ("xla", "cuda", "rocm", "metal", "vulkan", "cpu")
SOFTWARE_RENDERERS = ("llvmpipe", "lavapipe", "swiftshader")


def auto_backend(reports: "list[DeviceReport]") -> str | None:
    """The backend `--backend auto` picks from `pcp devices`' reports, or None."""
    by_name = {report.backend: report for report in reports if report.available}
    for name in AUTO_ORDER:
        report = by_name.get(name)
        if report is None or not report.devices:
            continue
        if name == "xla" and report.arch == "cpu":
            continue  # XLA on the host: the IREE cpu backend is faster there
        if name == "vulkan" and all(
            any(s in device.lower() for s in SOFTWARE_RENDERERS) for device in report.devices
        ):
            continue
        return name
    return None
