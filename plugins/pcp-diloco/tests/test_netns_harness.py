"""The network-namespace harness itself (netns.py), with a plain TCP echo server on one
host and one-shot clients on others: hosts reach each other, and a cut cable, a
partition and dropped packets each do what the fault-tolerance tests count on.

They need root and iproute2: elsewhere they skip with the reason, under CI they fail.
"""

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from . import netns
from .netns import Host, Network

pytestmark = pytest.mark.alone  # packet timing

PORT = 7000
SERVER = """
import socket, sys, threading
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
def echo(conn):
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
"""
# Connects, then times `rounds` echoes; prints {"rtt": the fastest} or {"error": errno's name}.
CLIENT = """
import errno, json, socket, sys, time
address, port, timeout, rounds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
try:
    with socket.create_connection((address, port), timeout=timeout) as conn:
        times = []
        for _ in range(rounds):
            start = time.monotonic()
            conn.sendall(b"ping")
            received = b""
            while len(received) < 4:
                received += conn.recv(4 - len(received)) or b"?" * 4
            times.append(time.monotonic() - start)
    print(json.dumps({"rtt": min(times)}))
except OSError as error:
    print(json.dumps({"error": errno.errorcode.get(error.errno, type(error).__name__)}))
"""


def serve(e2e: Any, net: Network, host: Host) -> None:
    """An echo server on `host`:PORT, started the way the pcp processes will be."""
    argv = [sys.executable, "-c", SERVER, host.address, str(PORT)]
    server = e2e.start(f"echo-{host.name}", net.command(host, argv))
    e2e.wait_for(lambda: "ready" in server.output(), 10, f"the echo server on {host.name}")


def probe(net: Network, source: Host, target: Host, timeout: float = 5, rounds: int = 1) -> dict:
    """From `source`, connect to `target`'s echo server: {"rtt": s} or {"error": name}."""
    argv = [sys.executable, "-c", CLIENT, target.address, str(PORT), str(timeout), str(rounds)]
    done = subprocess.run(
        net.command(source, argv), capture_output=True, text=True, timeout=timeout * rounds + 20
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_hosts_reach_each_other(e2e: Any, network: Callable[[int], Network]) -> None:
    net = network(3)
    assert [h.address for h in net.hosts] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    serve(e2e, net, net.hosts[0])
    for client in net.hosts[1:]:
        assert "rtt" in probe(net, client, net.hosts[0])


def test_cut_loses_packets_and_heal_restores_them(
    e2e: Any, network: Callable[[int], Network]
) -> None:
    net = network(2)
    server, client = net.hosts
    serve(e2e, net, server)
    net.cut(server)
    assert probe(net, client, server, timeout=1) == {"error": "TimeoutError"}
    net.heal(server)
    assert "rtt" in probe(net, client, server)


def test_partition_separates_the_sides_until_healed(
    e2e: Any, network: Callable[[int], Network]
) -> None:
    net = network(3)
    h1, h2, h3 = net.hosts
    serve(e2e, net, h1)
    serve(e2e, net, h3)
    net.partition([h2, h3])
    assert "rtt" in probe(net, h2, h3)  # one side still talks within itself
    assert probe(net, h2, h1, timeout=1) == {"error": "TimeoutError"}
    assert probe(net, h1, h3, timeout=1) == {"error": "TimeoutError"}
    net.heal_partition()
    assert "rtt" in probe(net, h2, h1)
    assert "rtt" in probe(net, h1, h3)


def test_dropped_packets_stop_the_link_until_cleared(
    e2e: Any, network: Callable[[int], Network]
) -> None:
    if reason := netns.shaping_unavailable():
        netns.skip_or_fail(reason)
    net = network(2)
    server, client = net.hosts
    serve(e2e, net, server)
    assert "rtt" in probe(net, client, server)
    net.drop(server, loss_pct=100)
    net.throttle(server, rate_mbit=1)
    assert probe(net, client, server, timeout=1) == {"error": "TimeoutError"}
    net.clear_shaping(server)
    assert "rtt" in probe(net, client, server)


@pytest.mark.usefixtures("network")  # skips, or fails under CI, as the others
def test_teardown_kills_processes_and_removes_namespaces(e2e: Any) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = f"{netns.PREFIX}{gone.pid}-1-h1"  # as a run that crashed would leave it
    subprocess.run(["ip", "netns", "add", stale], check=True)
    with netns.network(1) as net:
        assert not (netns.NETNS_DIR / stale).exists()
        host = net.hosts[0]
        sleeper = e2e.start("sleeper", net.command(host, ["sleep", "60"]))
        inside = ["ip", "netns", "pids", host.namespace]
        e2e.wait_for(
            lambda: str(sleeper.pid) in subprocess.run(inside, capture_output=True).stdout.decode(),
            5,
            "the sleeper's own pid in the namespace",
        )
    assert sleeper.wait(5) == -9
    assert not any((netns.NETNS_DIR / h.namespace).exists() for h in net.hosts)
    assert not (netns.NETNS_DIR / net.switch).exists()
