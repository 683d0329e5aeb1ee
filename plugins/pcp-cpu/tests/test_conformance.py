from pcp_core.testing.backend_suite import BackendConformance


class TestCpuBackend(BackendConformance):
    backend_name = "cpu"
    compile_archs = ("x86-64",)
