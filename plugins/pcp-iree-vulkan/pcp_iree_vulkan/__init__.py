"""Any Vulkan device: IREE's `vulkan-spirv` target, `vulkan` driver.

The architecture is an IREE Vulkan target. The portable baseline profile is the
default and the only one that computes correctly on devices with subgroups narrower
than 16 (Mesa's lavapipe has 8: subgroup targets silently give wrong sums or NaN
there). Real GPUs get their vendor's target, which is faster and, on NVIDIA, also
deterministic where the baseline was not.
"""

from pcp_core import hookimpl
from pcp_core.backends import Backend, iree_device_dump
from pcp_core.iree.runtime import IreeRuntime

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for

BASELINE = "vp_android_baseline_2022"
VENDOR_TARGETS = {
    "0x10de": "ampere",  # NVIDIA (Ampere's target runs on Hopper too)
    "0x1002": "rdna3",  # AMD
    "0x13b5": "valhall4",  # Arm Mali
    "0x5143": "adreno",  # Qualcomm
}
MIN_SUBGROUP = 16


def target_for(device: dict[str, str]) -> str:
    subgroup = device.get("subgroup", "")
    sizes = [int(p.split("=")[1]) for p in subgroup.split() if p.startswith("minSubgroupSize=")]
    if device.get("type") == "cpu" or (sizes and sizes[0] < MIN_SUBGROUP):
        return BASELINE
    return VENDOR_TARGETS.get(device.get("vendor_id", "").lower(), BASELINE)


def detect_arch(device: int = 0) -> str | None:
    devices = iree_device_dump("vulkan")
    return target_for(devices[device]) if device < len(devices) else None


VULKAN = Backend(
    name="vulkan",
    runtime=IreeRuntime(
        target="vulkan-spirv",
        driver="vulkan",
        arch_flag="--iree-vulkan-target={arch}",
    ),
    default_arch=BASELINE,
    description="any Vulkan 1.3 device through IREE vulkan-spirv",
    detect_arch=detect_arch,
    install_hint=(
        "install a Vulkan loader and driver, e.g. `apt-get install libvulkan1 "
        "mesa-vulkan-drivers` (CPU: lavapipe) or your GPU vendor's driver"
    ),
    # IREE 3.13's SPIR-V path cannot compile bf16 products ("failed to legalize
    # operation 'vector.bitcast'"; "no GPU subgroup mma compute ops generated").
    precisions=("f32",),
)


@hookimpl
def pcp_register_backends(register) -> None:
    register(VULKAN)
