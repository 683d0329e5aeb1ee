from pcp_core.testing import InnerOptimizerConformance


class TestLion(InnerOptimizerConformance):
    optimizer_name = "lion"
    # Lion steps by the sign of its momentum: the key bias's gradient is zero but for
    # rounding noise, which differs between IREE and JAX
    unstable_params = ("h.0.attn.c_attn.bias",)
