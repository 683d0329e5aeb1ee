"""Detection answers for the HIP device a worker was given."""

import pcp_iree_rocm
import pytest

DUMP = """\
# --device=hip://GPU-aaaa
- amdhip64_dylib_path: /opt/rocm/lib/libamdhip64.so
- gpu-compute-capability: 9.4
- gpu-arch-name: gfx942:sramecc+:xnack-
# --device=hip://GPU-bbbb
- gpu-compute-capability: 11.0
- gpu-arch-name: gfx1100
"""

# `rocminfo`, shortened: a CPU agent, then two GPU agents with their ISA names
ROCMINFO = """\
Agent 1
  Name:                    AMD EPYC 9654 96-Core Processor
  Marketing Name:          AMD EPYC 9654 96-Core Processor
Agent 2
  Name:                    gfx90a
  Marketing Name:          AMD Instinct MI210
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-
Agent 3
  Name:                    gfx1100
  Marketing Name:          Radeon RX 7900 XTX
"""


def tools(monkeypatch: pytest.MonkeyPatch, dump: str, rocminfo: str) -> None:
    monkeypatch.setattr("pcp_core.backends.run_quietly", lambda command, **_: dump)
    monkeypatch.setattr(pcp_iree_rocm, "run_quietly", lambda command, **_: rocminfo)


def test_each_device_gets_its_own_architecture(monkeypatch: pytest.MonkeyPatch) -> None:
    tools(monkeypatch, DUMP, rocminfo="")
    assert [pcp_iree_rocm.detect_arch(i) for i in range(3)] == ["gfx942", "gfx1100", None]
    assert pcp_iree_rocm.ROCM.resolve_arch(None, 1) == "gfx1100"


def test_rocminfo_gpu_agents_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    tools(monkeypatch, dump="", rocminfo=ROCMINFO)
    assert [pcp_iree_rocm.detect_arch(i) for i in range(3)] == ["gfx90a", "gfx1100", None]
