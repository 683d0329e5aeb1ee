"""The core's runtime for every IREE backend: compile the StableHLO to a VMFB for the
backend's target (`pcp_core.iree.compiler`, cached), require the same IREE version on both
ends of the wire, and run it with `pcp_core.iree.executor.IreeExecutor`.
"""

from typing import Any

from pcp_core.backends import Artifact, Backend, Executor
from pcp_core.iree import executor, transfers
from pcp_core.iree.compiler import compile_program, iree_compiler_version, iree_runtime_version


class IreeRuntime:
    kind = "iree-vmfb"

    def build(self, program: Any, backend: Backend, arch: str) -> Artifact:
        compiled = compile_program(program.stablehlo_for(backend.unroll_steps), backend, arch)
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
        executor.require_device(backend, device)

    def describe_devices(self, backend: Backend) -> dict[str, Any]:
        return executor.describe_devices(backend)

    def open(self, artifact: bytes, backend: Backend, program: Any, device: int | None) -> Any:
        return executor.IreeExecutor(
            artifact,
            backend.driver,
            program.param_specs,
            program.opt_specs,
            device,
            backend.runtime_flags,
        )

    def assert_state_stays_on_device(self, running: Executor, batches: list[Any]) -> None:
        transfers.assert_state_stays_on_device(running, batches)


IREE = IreeRuntime()
