from pcp_core.testing import InnerOptimizerConformance


class TestAdamW(InnerOptimizerConformance):
    optimizer_name = "adamw"
