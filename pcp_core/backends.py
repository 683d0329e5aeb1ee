"""What a hardware backend is: an IREE compile target plus a runtime driver.

Backend plugins are thin descriptions; compiling, loading and running are core code.
"""

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from pcp_core.precision import PRECISIONS


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
    # Returns the architecture of the local device, or None when it cannot tell.
    detect_arch: Callable[[], str | None] | None = field(default=None, compare=False)

    def resolve_arch(self, requested: str | None = None) -> str:
        """The requested architecture, else the detected one, else the known-good default."""
        if requested:
            return requested
        if self.detect_arch is not None:
            detected = self.detect_arch()
            if detected:
                return detected
        return self.default_arch

    def check_precision(self, precision: str) -> None:
        if precision not in self.precisions:
            raise ValueError(
                f"backend {self.name!r} cannot train in {precision} "
                f"(it supports {', '.join(self.precisions)})"
            )

    def compile_flags(self, arch: str) -> list[str]:
        flags = [self.arch_flag.format(arch=arch)] if self.arch_flag else []
        return [*flags, *self.extra_flags]


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
            devices[-1].setdefault(key.strip(), value.strip())
    return devices
