from pcp_iree_cuda import arch_for

from pcp_core.testing.backend_suite import BackendConformance


class TestCudaBackend(BackendConformance):
    backend_name = "cuda"
    compile_archs = ("sm_86",)


def test_compute_capability_mapping() -> None:
    assert arch_for("8.6") == "sm_86" and arch_for("7.0") == "sm_70"
    assert arch_for("9.0") == "sm_80" and arch_for("12.0") == "sm_80"  # IREE 3.13 limit
    assert arch_for("garbage") is None
