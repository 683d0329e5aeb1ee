from pcp_core.testing import AlgorithmConformance


class TestDiLoCo(AlgorithmConformance):
    algorithm_name = "diloco"
    extra_args = ("--workers", "2", "--inner-steps", "20")
