"""Detection answers for the Vulkan device a worker was given."""

import pcp_iree_vulkan
import pytest
from pcp_iree_vulkan import BASELINE

DUMP = """\
# --device=vulkan://GPU-aaaa
name: llvmpipe (LLVM 15.0.6, 256 bits)
type: cpu
vendor_id: 0x10005
subgroup: size=8 minSubgroupSize=8 maxSubgroupSize=8
# --device=vulkan://GPU-bbbb
name: NVIDIA H100 80GB HBM3
type: discrete-gpu
vendor_id: 0x10de
subgroup: size=32 minSubgroupSize=32 maxSubgroupSize=32
"""


def test_each_device_gets_its_own_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pcp_core.backends.run_quietly", lambda command, **_: DUMP)
    assert [pcp_iree_vulkan.detect_arch(i) for i in range(3)] == [BASELINE, "ampere", None]
    assert pcp_iree_vulkan.VULKAN.resolve_arch(None, 1) == "ampere"
