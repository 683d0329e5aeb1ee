from pcp_core.testing import TransportConformance


class TestCapnpTcp(TransportConformance):
    transport_name = "capnp-tcp"
