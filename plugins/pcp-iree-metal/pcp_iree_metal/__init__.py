"""Apple GPUs: IREE's `metal-spirv` target, `metal` driver (macOS only at run time).

The architecture is the Metal platform (`macos`, `ios`, `ios-simulator`); programs
compile on any machine, which is how a Linux shepherd serves Mac workers. (IREE
3.13's compiler aborts on `ios` for the GPT step; `macos` compiles.)
"""

import platform

from pcp_core import hookimpl
from pcp_core.backends import Backend
from pcp_core.iree.runtime import IreeRuntime

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for


def detect_arch(device: int = 0) -> str | None:
    """The platform, which every device of this machine shares."""
    return "macos" if platform.system() == "Darwin" else None


METAL = Backend(
    name="metal",
    runtime=IreeRuntime(
        target="metal-spirv",
        driver="metal",
        arch_flag="--iree-metal-target-platform={arch}",
    ),
    default_arch="macos",
    description="Apple GPUs through IREE metal-spirv",
    detect_arch=detect_arch,
    install_hint="the metal driver exists only on macOS, in an iree-base-runtime built for it",
    # IREE 3.13's SPIR-V path cannot compile bf16 products ("failed to legalize
    # operation 'vector.bitcast'"; "no GPU subgroup mma compute ops generated").
    precisions=("f32",),
)


@hookimpl
def pcp_register_backends(register) -> None:
    register(METAL)
