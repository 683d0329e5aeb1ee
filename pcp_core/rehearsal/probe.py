"""Measure an emulated link: TCP goodput, round-trip time and packet loss.

The measuring ends (`probe_ends`) run as small child processes inside the nodes'
namespaces (`python -m pcp_core.rehearsal.probe <role> ...`); `measure_rate`,
`measure_rtt` and `measure_loss` start them and read their JSON answer. `python -m
pcp_core.rehearsal.probe accuracy` builds a few one-worker networks and prints how
close each comes to its configuration (the table in docs/wan.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from pcp_core.rehearsal.links import Network, run_in
from pcp_core.rehearsal.probe_ends import tcp_echo, tcp_ping, tcp_send, tcp_sink, udp_send, udp_sink
from pcp_core.rehearsal.rules import loss_chain

# TCP payload per Ethernet frame with timestamps (1448 of 1514 bytes): the goodput a
# link of a given wire rate can deliver at most.
PAYLOAD_SHARE = 1448 / 1514


# ---- the measuring side ----------------------------------------------------------------


def _start_end(network: Network, node: str, args: list[str]) -> subprocess.Popen[str]:
    """Start a listening end in `node`'s namespace and wait for its "listening" line."""
    process = network.popen(
        node,
        [sys.executable, "-m", "pcp_core.rehearsal.probe", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None  # stdout=PIPE
    line = process.stdout.readline()
    if line.strip() != "listening":
        process.kill()
        raise RuntimeError(f"probe {args[0]} in {node} did not start: {line!r}")
    return process


def _answer(process: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The JSON a probe end printed last."""
    out, _ = process.communicate(timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])


def _run_end(network: Network, node: str, args: list[str], timeout: float) -> dict[str, Any]:
    """Run a connecting end in `node`'s namespace to completion; its JSON answer."""
    result = network.run(
        node,
        [sys.executable, "-m", "pcp_core.rehearsal.probe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(f"probe {args[0]} in {node} failed: {result.stderr.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure_rate(
    network: Network, sender: str, receiver: str, seconds: float = 4.0, warmup: float = 1.0
) -> float:
    """TCP goodput in Mbit/s from `sender` to `receiver`, after `warmup` seconds."""
    sink = _start_end(network, receiver, ["tcp-sink", "5201", str(warmup)])
    try:
        host = network.address(receiver)
        _run_end(network, sender, ["tcp-send", host, "5201", str(seconds + warmup)], 60 + seconds)
        return float(_answer(sink, 30)["mbit"])
    finally:
        sink.kill()


def measure_rtt(
    network: Network, client: str, server: str, count: int = 20, interval: float = 0.02
) -> dict[str, Any]:
    """Application-level round trips from `client` to `server` over one TCP connection."""
    echo = _start_end(network, server, ["tcp-echo", "5202"])
    try:
        host = network.address(server)
        answer = _run_end(
            network, client, ["tcp-ping", host, "5202", str(count), str(interval)], 120
        )
        _answer(echo, 30)
        return answer
    finally:
        echo.kill()


@dataclass(frozen=True)
class LossMeasure:
    """What became of `sent` UDP datagrams: `received`, and of those the links' loss rules
    judged on the way (`judged` at the first rule), how many they `dropped`."""

    sent: int
    received: int
    judged: int
    dropped: int

    @property
    def share(self) -> float:
        """The share of the datagrams that did not arrive, for whatever reason."""
        return 1 - self.received / self.sent

    @property
    def link_share(self) -> float:
        """The share the links' loss rules dropped: the emulated loss alone."""
        return self.dropped / self.judged if self.judged else 0.0


def _loss_rules(network: Network, sender: str, receiver: str) -> list[tuple[str, str]]:
    """(namespace, interface) of each loss rule a packet from `sender` to `receiver` meets."""
    rules = []
    if network.node(sender).link.loss_percent > 0:  # entering the router from the sender
        rules.append((network.router, network.node(sender).router_interface))
    if network.node(receiver).link.loss_percent > 0:  # entering the receiver from its link
        rules.append((network.node(receiver).namespace, "eth0"))
    return rules


def _rule_counts(namespace: str, interface: str) -> tuple[int, int]:
    """(packets judged, packets dropped) so far by the loss rule on `interface`."""
    listed = run_in(
        namespace,
        ["nft", "-j", "list", "chain", "netdev", "pcp_loss", loss_chain(interface)],
        capture_output=True,
        text=True,
        check=True,
    )
    counters = [
        expression["counter"]["packets"]
        for item in json.loads(listed.stdout)["nftables"]
        if "rule" in item
        for expression in item["rule"]["expr"]
        if "counter" in expression
    ]
    judged, dropped = counters
    return judged, dropped


def measure_loss(
    network: Network, sender: str, receiver: str, count: int = 4000, rate: float = 2000
) -> LossMeasure:
    """Send `count` UDP datagrams from `sender` to `receiver`; where they were lost."""
    rules = _loss_rules(network, sender, receiver)
    before = [_rule_counts(*rule) for rule in rules]
    sink = _start_end(network, receiver, ["udp-sink", "5203", "3.0"])
    try:
        host = network.address(receiver)
        _run_end(network, sender, ["udp-send", host, "5203", str(count), str(rate)], 60)
        received = _answer(sink, 30)["received"]
    finally:
        sink.kill()
    counts = [
        (judged - judged_before, dropped - dropped_before)
        for (judged, dropped), (judged_before, dropped_before) in zip(
            [_rule_counts(*rule) for rule in rules], before, strict=True
        )
    ]
    return LossMeasure(
        sent=count,
        received=received,
        judged=counts[0][0] if counts else 0,
        dropped=sum(dropped for _, dropped in counts),
    )


def accuracy(rates: list[float], delays: list[float], seconds: float) -> list[dict[str, Any]]:
    """Measure goodput and RTT for each rate × one-way delay on a one-worker network."""
    from statistics import median

    from pcp_core.rehearsal.links import emulated_network
    from pcp_core.rehearsal.scenario import Link, Scenario, Worker

    rows = []
    for rate in rates:
        for delay in delays:
            scenario = Scenario(
                name="accuracy",
                shepherd=Link(rate_mbit=10_000),
                workers=[Worker("w", Link(rate_mbit=rate, delay_ms=delay))],
            )
            with emulated_network(scenario) as network:
                up = measure_rate(network, "w", "shepherd", seconds=seconds)
                down = measure_rate(network, "shepherd", "w", seconds=seconds)
                rtt = measure_rtt(network, "w", "shepherd")
            rows.append(
                {
                    "rate_mbit": rate,
                    "delay_ms": delay,
                    "goodput_up_mbit": round(up, 2),
                    "goodput_down_mbit": round(down, 2),
                    "goodput_share": round(min(up, down) / rate, 3),
                    "rtt_expected_ms": 2 * delay,
                    "rtt_median_ms": round(median(rtt["rtt_ms"]), 2),
                    "rtt_max_ms": round(max(rtt["rtt_ms"]), 2),
                    "first_exchange_ms": round(rtt["first_exchange_ms"], 2),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    """The probe ends' command line (and `accuracy`, run as root)."""
    parser = argparse.ArgumentParser(prog="python -m pcp_core.rehearsal.probe")
    sub = parser.add_subparsers(dest="role", required=True)
    p = sub.add_parser("tcp-sink")
    p.add_argument("port", type=int)
    p.add_argument("warmup", type=float)
    p = sub.add_parser("tcp-send")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("seconds", type=float)
    p = sub.add_parser("tcp-echo")
    p.add_argument("port", type=int)
    p = sub.add_parser("tcp-ping")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("count", type=int)
    p.add_argument("interval", type=float)
    p = sub.add_parser("udp-sink")
    p.add_argument("port", type=int)
    p.add_argument("idle", type=float)
    p = sub.add_parser("udp-send")
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("count", type=int)
    p.add_argument("rate", type=float)
    p = sub.add_parser("accuracy", help="measure rate and RTT of a few links (needs root)")
    p.add_argument("--rates", default="20,100", help="Mbit/s, comma-separated")
    p.add_argument("--delays", default="10,150", help="one-way ms, comma-separated")
    p.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args(argv)
    if args.role == "accuracy":
        accuracy(
            [float(v) for v in args.rates.split(",")],
            [float(v) for v in args.delays.split(",")],
            args.seconds,
        )
        return 0
    handlers = {
        "tcp-sink": lambda: tcp_sink(args.port, args.warmup),
        "tcp-send": lambda: tcp_send(args.host, args.port, args.seconds),
        "tcp-echo": lambda: tcp_echo(args.port),
        "tcp-ping": lambda: tcp_ping(args.host, args.port, args.count, args.interval),
        "udp-sink": lambda: udp_sink(args.port, args.idle),
        "udp-send": lambda: udp_send(args.host, args.port, args.count, args.rate),
    }
    print(json.dumps(handlers[args.role]()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
