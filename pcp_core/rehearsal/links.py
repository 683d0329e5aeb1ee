"""Emulated links: one network namespace per node, joined through a router namespace.

Topology (docs/wan.md has the whole story):

```
 pcpw-<pid>-<n>-shepherd         pcpw-<pid>-<n>-router              pcpw-<pid>-<n>-<worker>
 eth0 10.77.0.2 ── veth ── l0 10.77.0.1      l1 10.77.1.1 ── veth ── eth0 10.77.1.2
                                   relay (delay, jitter)      l2 10.77.2.1 ── veth ── ...
```

Each node has its own veth pair to the router, so each link has its own rate (tbf on
the egress of both ends), its own loss (nftables random drop on the ingress of both
ends) and its own delay (the relay in the router namespace, pcp_core/rehearsal/relay.py,
which every forwarded TCP connection is redirected to). Traffic between two nodes
crosses both of their links, so the shepherd's own cap is shared by all its workers.

`emulated_network` builds all of it and removes all of it on exit (also on Ctrl-C,
SIGTERM or an exception); `cleanup_stale` removes what a killed earlier run left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from pcp_core.rehearsal.rules import loss_ruleset, redirect_ruleset, tbf_arguments
from pcp_core.rehearsal.scenario import Link, Scenario

log = structlog.get_logger(__name__)

PREFIX = "pcpw-"
RELAY_PORT = 7999
SUBNET = "10.77"  # link i is 10.77.i.0/24: the router is .1, the node .2
NETNS_DIR = "/run/netns"
_counter = iter(range(1_000_000))


class LinkSetupError(RuntimeError):
    """A command needed to build the emulated network failed."""


@dataclass(frozen=True)
class Node:
    """One node of the emulated network: its namespace, address and link."""

    name: str
    namespace: str
    address: str
    router_address: str
    router_interface: str
    link: Link


@dataclass
class Network:
    """A built network: the router's namespace, every node, and the relay process."""

    tag: str
    router: str
    nodes: dict[str, Node]
    relay: subprocess.Popen[str] | None = None
    namespaces: list[str] = field(default_factory=list)

    def node(self, name: str) -> Node:
        """Return the node called `name` ('shepherd' or a worker's name)."""
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"no node {name!r}; nodes: {', '.join(self.nodes)}") from None

    def address(self, name: str) -> str:
        """Return the IPv4 address other nodes reach `name` at."""
        return self.node(name).address

    def run(self, name: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Run a command to completion inside node `name`'s namespace."""
        return run_in(self.node(name).namespace, argv, **kwargs)

    def popen(self, name: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start a command inside node `name`'s namespace and return its process."""
        return popen_in(self.node(name).namespace, argv, **kwargs)


def requirements_problem() -> str | None:
    """Say why links cannot be built here (not root, no ip/tc/nft), or None."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root or with CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (iproute2 and nftables are needed)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"'ip netns' does not work here: {probe.stderr.strip()}"
    return None


def _sh(argv: Sequence[str], *, input: str | None = None) -> str:
    """Run one setup command; raise LinkSetupError with its stderr when it fails."""
    result = subprocess.run(list(argv), capture_output=True, text=True, input=input)
    if result.returncode != 0:
        command = " ".join(argv)
        raise LinkSetupError(f"`{command}` failed: {result.stderr.strip() or result.returncode}")
    return result.stdout


def run_in(namespace: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """Run a command to completion inside a network namespace (`ip netns exec`)."""
    return subprocess.run(["ip", "netns", "exec", namespace, *argv], **kwargs)


def popen_in(namespace: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
    """Start a command inside a network namespace (`ip netns exec`); return the process."""
    return subprocess.Popen(["ip", "netns", "exec", namespace, *argv], **kwargs)


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    """Names of the network namespaces that start with `prefix`."""
    result = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    names = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]
    return sorted(name for name in names if name.startswith(prefix))


def _owner_alive(namespace: str) -> bool:
    """Whether the process whose pid is in the namespace's name still runs."""
    try:
        pid = int(namespace[len(PREFIX) :].split("-", 1)[0])
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_namespace(namespace: str) -> None:
    """Stop the processes inside a namespace, then delete it (its veths go with it)."""
    pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    for word in pids.stdout.split():
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.kill(int(word), signal.SIGKILL)
    result = subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, text=True)
    if result.returncode != 0 and os.path.exists(os.path.join(NETNS_DIR, namespace)):
        log.warning("netns_delete_failed", namespace=namespace, error=result.stderr.strip())


def cleanup_stale(prefix: str = PREFIX) -> list[str]:
    """Delete the namespaces (and the processes in them) left by runs that are gone.

    A namespace is stale when the process whose pid its name carries no longer runs,
    so a second harness running at the same time is left alone.
    """
    stale = [name for name in list_namespaces(prefix) if not _owner_alive(name)]
    for name in stale:
        _delete_namespace(name)
    if stale:
        log.info("stale_namespaces_removed", namespaces=stale)
    return stale


def relay_spec(network: Network, port: int) -> dict[str, Any]:
    """The relay's configuration: its port and, per node address, the link's numbers."""
    return {
        "port": port,
        "links": {
            node.address: {
                "name": node.name,
                "rate_mbit": node.link.rate_mbit,
                "delay_ms": node.link.delay_ms,
                "jitter_ms": node.link.jitter_ms,
            }
            for node in network.nodes.values()
        },
    }


def _add_node(network: Network, index: int, name: str, link: Link) -> Node:
    """Make a node's namespace and veth pair, its addresses, rate limits and loss rules."""
    namespace = f"{PREFIX}{network.tag}-{name}"
    _sh(["ip", "netns", "add", namespace])
    network.namespaces.append(namespace)
    router_if = f"l{index}"
    address, router_address = f"{SUBNET}.{index}.2", f"{SUBNET}.{index}.1"
    # Created straight into both namespaces: no name ever exists in the host's namespace.
    peer = ["peer", "name", router_if, "netns", network.router]
    _sh(["ip", "link", "add", "eth0", "netns", namespace, "type", "veth", *peer])
    for ns, interface, own in (
        (namespace, "eth0", address),
        (network.router, router_if, router_address),
    ):
        if link.loss_percent > 0:
            # One segment per skb, so the loss rule drops single packets, not 64 KiB
            # GSO bursts. It costs CPU (about 440 Mbit/s at most here), so only lossy
            # links pay it; tbf splits a GSO skb larger than its burst by itself.
            _sh(["ip", "-n", ns, "link", "set", interface, "gso_max_segs", "1"])
        _sh(["ip", "-n", ns, "addr", "add", f"{own}/24", "dev", interface])
        _sh(["ip", "-n", ns, "link", "set", interface, "up"])
        tbf = tbf_arguments(link)
        _sh(["tc", "-n", ns, "qdisc", "replace", "dev", interface, "root", "tbf", *tbf])
        if link.loss_percent > 0:
            _sh(
                ["ip", "netns", "exec", ns, "nft", "-f", "-"],
                input=loss_ruleset(interface, link.loss_percent),
            )
    _sh(["ip", "-n", namespace, "link", "set", "lo", "up"])
    _sh(["ip", "-n", namespace, "route", "add", "default", "via", router_address])
    return Node(name, namespace, address, router_address, router_if, link)


def _start_relay(network: Network, port: int, timeout: float = 15.0) -> subprocess.Popen[str]:
    """Start the delaying relay in the router's namespace and wait until it listens."""
    spec = json.dumps(relay_spec(network, port))
    process = popen_in(
        network.router,
        [sys.executable, "-m", "pcp_core.rehearsal.relay", spec],
        stdout=subprocess.PIPE,
        text=True,
    )
    ready: list[str] = []
    stdout = process.stdout
    assert stdout is not None  # stdout=PIPE
    reader = threading.Thread(target=lambda: ready.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not ready or not ready[0].startswith("ready"):
        process.kill()
        process.wait()
        raise LinkSetupError(f"the relay did not start within {timeout:.0f} s (see its stderr)")
    return process


def _stop(process: subprocess.Popen[str] | None) -> None:
    """Stop a child process: SIGTERM, then SIGKILL after 3 s."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(3)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def teardown(network: Network) -> None:
    """Stop the relay and delete every namespace of the network; never raises."""
    _stop(network.relay)
    for namespace in reversed(network.namespaces):
        try:
            _delete_namespace(namespace)
        except Exception as error:  # teardown must go on to the next namespace
            log.warning("netns_teardown_failed", namespace=namespace, error=str(error))


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while the network exists, so teardown runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def emulated_network(
    scenario: Scenario, *, relay: bool = True, relay_port: int = RELAY_PORT
) -> Iterator[Network]:
    """Build the scenario's namespaces, links and relay; tear all of it down on exit.

    relay=False leaves out the delaying relay (and its TCP redirect): delay and jitter
    are then not applied, rate and loss still are.
    """
    problem = requirements_problem()
    if problem:
        raise LinkSetupError(problem)
    cleanup_stale()
    tag = f"{os.getpid()}-{next(_counter)}"
    network = Network(tag=tag, router=f"{PREFIX}{tag}-router", nodes={})
    started = time.monotonic()
    with _sigterm_as_exit():
        try:
            _sh(["ip", "netns", "add", network.router])
            network.namespaces.append(network.router)
            _sh(["ip", "-n", network.router, "link", "set", "lo", "up"])
            _sh(["ip", "netns", "exec", network.router, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
            nodes = [("shepherd", scenario.shepherd)] + [(w.name, w.link) for w in scenario.workers]
            for index, (name, link) in enumerate(nodes):
                network.nodes[name] = _add_node(network, index, name, link)
            if relay:
                _sh(
                    ["ip", "netns", "exec", network.router, "nft", "-f", "-"],
                    input=redirect_ruleset(relay_port),
                )
                network.relay = _start_relay(network, relay_port)
            log.info(
                "emulated_network_up",
                scenario=scenario.name,
                nodes=len(network.nodes),
                seconds=round(time.monotonic() - started, 2),
            )
            yield network
        finally:
            teardown(network)
            log.info("emulated_network_down", scenario=scenario.name, tag=tag)
