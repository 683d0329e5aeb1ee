"""The core's runtime for every IREE backend, with the backend's IREE target: compile the
StableHLO to a VMFB (`pcp_core.iree.compiler`, cached), require the same IREE version on
both ends of the wire, and run it with `pcp_core.iree.executor.IreeExecutor`.

An IREE backend plugin is a `Backend` whose runtime is an `IreeRuntime` naming its
compile target and driver:

    Backend(name="cpu", runtime=IreeRuntime(target="llvm-cpu", driver="local-task"), ...)
"""

from dataclasses import dataclass
from typing import Any, ClassVar

from pcp_core.backends import Artifact, Backend, DeviceReport, Executor
from pcp_core.iree import executor, transfers
from pcp_core.iree.compiler import compile_program, iree_compiler_version, iree_runtime_version

# Drivers whose device memory is this machine's memory.
HOST_DRIVERS = ("local-task", "local-sync")


@dataclass(frozen=True)
class IreeRuntime:
    """An IREE compile target and runtime driver, and how PCP compiles and runs them."""

    target: str  # IREE compile target backend, e.g. "llvm-cpu"
    driver: str  # IREE runtime driver, e.g. "local-task"
    # Flag that selects the architecture; "{arch}" is replaced by the architecture.
    arch_flag: str | None = None
    extra_flags: tuple[str, ...] = ()
    # IREE runtime flags for the driver (process-wide; parsed before it is first used).
    runtime_flags: tuple[str, ...] = ()
    # Compile the K steps of a call straight-line instead of as a loop (TrainProgram.
    # stablehlo_for): faster where the loop costs copies and re-recorded command
    # buffers (GPUs), several times slower to compile.
    unroll_steps: bool = False

    kind: ClassVar[str] = "iree-vmfb"

    @property
    def host_memory(self) -> bool:
        return self.driver in HOST_DRIVERS

    def compile_flags(self, arch: str) -> list[str]:
        flags = [self.arch_flag.format(arch=arch)] if self.arch_flag else []
        return [*flags, *self.extra_flags]

    def build(self, program: Any, backend: Backend, arch: str) -> Artifact:
        compiled = compile_program(program.stablehlo_for(self.unroll_steps), backend, arch)
        return Artifact(
            self.kind, compiled.vmfb, compiled.sha256, backend.name, arch, compiled.cache_hit
        )

    def worker_report(self, backend: Backend) -> dict[str, Any]:
        return {"iree": iree_runtime_version()}

    def refusal(self, backend: Backend, arch: str, report: dict[str, Any]) -> str | None:
        compiler, theirs = iree_compiler_version(), report.get("iree")
        if theirs == compiler:
            return None
        return (
            f"IREE version mismatch: the shepherd compiles with IREE {compiler} but this "
            f"worker runs iree-base-runtime {theirs}; install iree-base-runtime=={compiler}"
        )

    def require_device(self, backend: Backend, device: int | None) -> None:
        executor.require_device(self.driver, backend.install_hint, self.runtime_flags, device)

    def describe_devices(self, backend: Backend) -> DeviceReport:
        found, note = executor.list_devices(self.driver, backend.install_hint)
        return DeviceReport(
            backend=backend.name,
            runtime=f"iree {self.driver}",
            available=bool(found),
            devices=found,
            arch=backend.resolve_arch(),
            note=note,
        )

    def open(self, artifact: bytes, backend: Backend, program: Any, device: int | None) -> Any:
        return executor.IreeExecutor(
            artifact,
            self.driver,
            program.param_specs,
            program.opt_specs,
            device,
            self.runtime_flags,
        )

    def assert_state_stays_on_device(self, running: Executor, batches: list[Any]) -> None:
        transfers.assert_state_stays_on_device(running, batches)
