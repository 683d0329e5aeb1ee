"""AMD GPUs: IREE's `rocm` target for a `gfx…` architecture, `hip` driver.

In IREE 3.13 the architecture flag is `--iree-rocm-target` (`--iree-hip-target` is
not known yet). Detection reads the first GPU agent that `rocminfo` lists.
"""

import re

from pcp_core import hookimpl
from pcp_core.backends import Backend, run_quietly

PCP_PLUGIN_API = 3  # the pcp_core.PLUGIN_API this plugin is written for


def detect_arch() -> str | None:
    found = re.search(r"\bgfx[0-9a-f]{3,4}\b", run_quietly(["rocminfo"]))
    return found.group(0) if found else None


ROCM = Backend(
    name="rocm",
    target="rocm",
    driver="hip",
    default_arch="gfx942",
    description="AMD GPUs through IREE rocm/HIP",
    arch_flag="--iree-rocm-target={arch}",
    detect_arch=detect_arch,
    install_hint="install ROCm (libamdhip64.so) and check `rocminfo` lists a GPU",
)


@hookimpl
def pcp_register_backends(register) -> None:
    register(ROCM)
