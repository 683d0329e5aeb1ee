from pcp_core.testing.backend_suite import BackendConformance


class TestXlaBackend(BackendConformance):
    backend_name = "xla"
    rtol = 1e-5  # the same program through the same compiler as the JAX reference
