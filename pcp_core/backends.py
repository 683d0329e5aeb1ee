"""What a hardware backend is: an IREE compile target plus a runtime driver.

Backend plugins are thin descriptions; compiling, loading and running are core code.
"""

import inspect
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from pcp_core.precision import PRECISIONS

log = structlog.get_logger(__name__)

# `detect_arch(device)`: the architecture of device index `device` (0 is the first, as
# `--device` counts), or None when it cannot tell. The zero-argument form that backends
# wrote before detection took a device is still called: it speaks for every device.
DetectArch = Callable[[int], str | None] | Callable[[], str | None]


@dataclass(frozen=True)
class Backend:
    """One kind of device PCP can compile for and run on."""

    name: str
    target: str  # IREE compile target backend, e.g. "llvm-cpu"
    driver: str  # IREE runtime driver, e.g. "local-task"
    default_arch: str  # used when detection is impossible
    description: str = ""
    # Flag that selects the architecture; "{arch}" is replaced by the architecture.
    arch_flag: str | None = None
    extra_flags: tuple[str, ...] = ()
    # IREE runtime flags for the driver (process-wide; parsed before it is first used).
    runtime_flags: tuple[str, ...] = ()
    # The run precisions (pcp_core.precision) its target compiles.
    precisions: tuple[str, ...] = PRECISIONS
    # What to install when the runtime driver or device is missing (one line).
    install_hint: str = ""
    # The architecture of a local device (see DetectArch), or None when it cannot tell.
    detect_arch: DetectArch | None = field(default=None, compare=False)

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

    def compile_flags(self, arch: str) -> list[str]:
        flags = [self.arch_flag.format(arch=arch)] if self.arch_flag else []
        return [*flags, *self.extra_flags]


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
