from pcp_core.testing.backend_suite import BackendConformance


class TestMetalBackend(BackendConformance):
    """Only `macos` is checked: IREE 3.13's compiler aborts on the `ios` platform."""

    backend_name = "metal"
