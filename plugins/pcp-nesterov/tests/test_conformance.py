from pcp_core.testing import OuterOptimizerConformance


class TestNesterov(OuterOptimizerConformance):
    optimizer_name = "nesterov"
