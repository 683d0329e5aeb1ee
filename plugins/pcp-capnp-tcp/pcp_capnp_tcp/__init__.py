"""PCP transport `capnp-tcp`: Cap'n Proto frame headers over TCP, tensors as raw bytes.

Importing this package is cheap: `capnp` is imported only when a frame is built or read.
"""

from pcp_capnp_tcp.network import connect, listen
from pcp_core import hookimpl
from pcp_core.wire.transport import Transport

PCP_PLUGIN_API = 5  # the pcp_core.PLUGIN_API this plugin is written for

TRANSPORT = Transport(
    name="capnp-tcp",
    listen=listen,
    connect=connect,
    description="Cap'n Proto headers + raw little-endian tensor bytes over TCP, optional TLS",
)


@hookimpl
def pcp_register_transports(register) -> None:
    register(TRANSPORT)
