"""The kernel rules of one emulated link: tbf arguments for its rate, nftables rulesets
for its loss and for redirecting forwarded TCP to the delaying relay.

Pure functions of the scenario's numbers, kept apart from `links` (which runs them) so
they can be read and tested without root. docs/wan.md says what each one really does.
"""

from __future__ import annotations

from pcp_core.rehearsal.scenario import Link

MTU_BYTES = 1514  # an Ethernet frame as tbf counts it (skb length with the MAC header)


def tbf_arguments(link: Link) -> list[str]:
    """`tc qdisc ... tbf` arguments for a link: its rate, a burst and a queue limit.

    The burst is 2 ms at the link's rate, at least two full frames; the queue holds
    50 ms at the rate (at least 64 KiB), like a modest router buffer.
    """
    rate_bytes = link.rate_mbit * 1e6 / 8
    burst = max(2 * MTU_BYTES, int(rate_bytes * 0.002))
    limit = max(65536, int(rate_bytes * 0.050), 3 * burst)
    return ["rate", f"{int(link.rate_mbit * 1e6)}bit", "burst", str(burst), "limit", str(limit)]


def loss_chain(interface: str) -> str:
    """The name of the nftables chain that drops packets entering `interface`."""
    return f"ingress_{interface}"


def loss_ruleset(interface: str, loss_percent: float) -> str:
    """An nftables ruleset that drops `loss_percent` of the packets entering `interface`.

    Its two counters (every packet judged, those dropped) let a probe tell the link's
    loss from packets the host lost elsewhere (`probe.measure_loss`).
    """
    threshold = round(loss_percent * 10_000)  # numgen draws in [0, 1_000_000)
    return (
        "table netdev pcp_loss {\n"
        f"  chain {loss_chain(interface)} {{\n"
        f'    type filter hook ingress device "{interface}" priority 0; policy accept;\n'
        "    counter\n"
        f"    numgen random mod 1000000 < {threshold} counter drop\n"
        "  }\n"
        "}\n"
    )


def redirect_ruleset(port: int) -> str:
    """An nftables ruleset sending every TCP connection the router would forward to the relay."""
    return (
        "table ip pcp_relay {\n"
        "  chain prerouting {\n"
        "    type nat hook prerouting priority dstnat; policy accept;\n"
        f"    meta l4proto tcp fib daddr type != local redirect to :{port}\n"
        "  }\n"
        "}\n"
    )
