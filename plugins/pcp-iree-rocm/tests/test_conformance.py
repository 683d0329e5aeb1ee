from pcp_core.testing.backend_suite import BackendConformance


class TestRocmBackend(BackendConformance):
    backend_name = "rocm"
    compile_archs = ("gfx90a", "gfx1100")  # gfx942 is the default, compiled anyway
