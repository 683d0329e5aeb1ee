"""AMD GPUs: IREE's `rocm` target for a `gfx…` architecture, `hip` driver.

In IREE 3.13 the architecture flag is `--iree-rocm-target` (`--iree-hip-target` is
not known yet). Detection asks IREE's HIP driver, else `rocminfo`, about the given device.
"""

import re

from pcp_core import hookimpl
from pcp_core.backends import Backend, iree_device_dump, run_quietly
from pcp_core.iree.runtime import IreeRuntime

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for


def detect_arch(device: int = 0) -> str | None:
    """The architecture of HIP device index `device`: from IREE's dump of the devices
    ("gfx942:sramecc+:xnack-"), else from the GPU agents `rocminfo` lists, in order."""
    devices = iree_device_dump("hip")
    if device < len(devices) and devices[device].get("gpu-arch-name"):
        return devices[device]["gpu-arch-name"].split(":")[0]
    agents = re.findall(r"^\s*Name:\s+(gfx[0-9a-f]{3,4})\s*$", run_quietly(["rocminfo"]), re.M)
    return agents[device] if device < len(agents) else None


ROCM = Backend(
    name="rocm",
    runtime=IreeRuntime(
        target="rocm",
        driver="hip",
        arch_flag="--iree-rocm-target={arch}",
    ),
    default_arch="gfx942",
    description="AMD GPUs through IREE rocm/HIP",
    detect_arch=detect_arch,
    install_hint="install ROCm (libamdhip64.so) and check `rocminfo` lists a GPU",
)


@hookimpl
def pcp_register_backends(register) -> None:
    register(ROCM)
