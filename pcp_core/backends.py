"""What a hardware backend is: an IREE compile target plus a runtime driver.

Backend plugins are thin descriptions; compiling, loading and running are core code.
"""

from collections.abc import Callable
from dataclasses import dataclass, field


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

    def compile_flags(self, arch: str) -> list[str]:
        flags = [self.arch_flag.format(arch=arch)] if self.arch_flag else []
        return [*flags, *self.extra_flags]
