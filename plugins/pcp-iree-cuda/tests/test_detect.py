"""Detection answers for the CUDA device a worker was given, as IREE numbers them."""

import pcp_iree_cuda
import pytest

# What `iree-run-module --dump_devices=cuda` prints (IREE 3.13; the first as on an H100),
# shortened, for a machine with two different GPUs.
DUMP = """\
# --device=cuda://GPU-aaaa
#   NVIDIA GeForce RTX 2080
# ===----------------------------------------------------------------------===

- gpu-compute-capability: 7.5
- driver-max-cuda-version: 13.0
# --device=cuda://GPU-bbbb
#   NVIDIA GeForce RTX 3090
# ===----------------------------------------------------------------------===

- gpu-compute-capability: 8.6
"""


def tools(monkeypatch: pytest.MonkeyPatch, dump: str, smi: str) -> None:
    monkeypatch.setattr("pcp_core.backends.run_quietly", lambda command, **_: dump)
    monkeypatch.setattr(pcp_iree_cuda, "run_quietly", lambda command, **_: smi)


def test_each_device_gets_its_own_target(monkeypatch: pytest.MonkeyPatch) -> None:
    tools(monkeypatch, DUMP, smi="")
    assert [pcp_iree_cuda.detect_arch(i) for i in range(3)] == ["sm_75", "sm_86", None]
    assert pcp_iree_cuda.CUDA.resolve_arch(None, 1) == "sm_86"


def test_nvidia_smi_answers_only_where_its_order_is_cudas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without IREE's dump: nvidia-smi counts by PCI bus, CUDA fastest first by default."""
    tools(monkeypatch, dump="", smi="7.5\n8.6\n")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert pcp_iree_cuda.detect_arch(1) is None  # unknown: the backend's default is used
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert [pcp_iree_cuda.detect_arch(i) for i in range(3)] == ["sm_75", "sm_86", None]
    tools(monkeypatch, dump="", smi="9.0\n9.0\n")
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    assert pcp_iree_cuda.detect_arch(1) == "sm_80"  # all alike: any order will do
