from pcp_iree_vulkan import BASELINE, target_for

from pcp_core.testing.backend_suite import BackendConformance


class TestVulkanBackend(BackendConformance):
    backend_name = "vulkan"
    compile_archs = ("ampere", "rdna3")
    rtol = 1e-4


def test_lavapipe_and_narrow_subgroups_get_the_baseline() -> None:
    lavapipe = {"type": "cpu", "vendor_id": "0x10005", "subgroup": "size=8 minSubgroupSize=8"}
    assert target_for(lavapipe) == BASELINE
    nvidia = {"type": "discrete-gpu", "vendor_id": "0x10de", "subgroup": "minSubgroupSize=32"}
    assert target_for(nvidia) == "ampere"
    narrow = {"type": "integrated-gpu", "vendor_id": "0x1002", "subgroup": "minSubgroupSize=8"}
    assert target_for(narrow) == BASELINE
