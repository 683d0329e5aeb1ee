"""NVIDIA GPUs: IREE's `cuda` target (PTX for an `sm_XY` architecture), `cuda` driver.

IREE 3.13 cannot target sm_90 or newer ("missing GPU target"), but sm_80 PTX is
JIT-compiled by the driver and runs on Hopper and later, so those map to sm_80.
"""

from pcp_core import hookimpl
from pcp_core.backends import Backend, iree_device_dump, run_quietly

NEWEST_SUPPORTED = (8, 9)  # the newest compute capability IREE 3.13 emits code for
FALLBACK = "sm_80"


def arch_for(capability: str) -> str | None:
    """The IREE target for a compute capability such as "8.6" or "9.0"."""
    try:
        major, minor = (int(part) for part in capability.strip().split(".")[:2])
    except ValueError:
        return None
    if (major, minor) > NEWEST_SUPPORTED:
        return FALLBACK
    return f"sm_{major}{minor}"


def detect_arch() -> str | None:
    for device in iree_device_dump("cuda"):
        if "gpu-compute-capability" in device:
            return arch_for(device["gpu-compute-capability"])
    query = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"]
    first = run_quietly(query).strip().splitlines()
    return arch_for(first[0]) if first else None


CUDA = Backend(
    name="cuda",
    target="cuda",
    driver="cuda",
    default_arch=FALLBACK,
    description="NVIDIA GPUs through IREE cuda",
    arch_flag="--iree-cuda-target={arch}",
    detect_arch=detect_arch,
    install_hint="install the NVIDIA driver (libcuda.so) and check `nvidia-smi` sees a GPU",
)


@hookimpl
def pcp_register_backends(register) -> None:
    register(CUDA)
