"""Hosts with their own IP addresses on one machine, for fault-tolerance tests.

`network(n)` builds n network namespaces ("hosts") 10.77.0.1 ... 10.77.0.n, each joined
by a veth pair to a bridge in a "switch" namespace of its own, so a test can run a
shepherd and its workers on separate hosts, then cut a host's cable, partition the
switch, or slow a link down (tbf) and drop its packets (nftables); this kernel, like
CI's, has no netem. Nothing touches the machine's own namespace: no host has a route
off its /24, so no packet of a test leaves the switch.

Names carry the test process's pid, so parallel runs do not collide, and a run finds and
removes what a crashed run of a pid no longer alive left behind. Needs root and iproute2
(`ip`, `tc`), and nftables for `drop`; `netns_unavailable()` and `shaping_unavailable()`
say why not, and `skip_or_fail` skips with that reason, or fails under CI, which
installs what they need.
"""

import contextlib
import functools
import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

PREFIX = "pcpnet-"
SUBNET = "10.77.0"  # a /24 that the machine's own networks are unlikely to use
NETNS_DIR = Path("/run/netns")  # where `ip netns add` mounts a namespace
_serial = itertools.count(1)


def ci() -> bool:
    """Whether this is CI, where a missing harness is a failure, not a skip."""
    return bool(os.environ.get("CI"))


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the test with `reason`; under CI, fail it, as CI must run it."""
    if ci():
        pytest.fail(f"{reason}: CI must run the network-namespace tests", pytrace=False)
    pytest.skip(reason)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`ip ARGS`; a failure raises with ip's own message."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _tc(namespace: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`tc ARGS` inside `namespace`."""
    done = subprocess.run(["tc", "-n", namespace, *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"tc -n {namespace} {' '.join(args)}: {done.stderr.strip()}")
    return done


@contextlib.contextmanager
def _scratch_namespace() -> Iterator[str]:
    name = f"{PREFIX}{os.getpid()}-probe"
    _ip("netns", "add", name)
    try:
        yield name
    finally:
        _ip("netns", "del", name, check=False)


@functools.cache
def netns_unavailable() -> str | None:
    """Why namespaces with veth pairs and a bridge cannot be built here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` here (Debian: apt-get install iproute2)"
    try:
        with _scratch_namespace() as name:
            _ip("-n", name, "link", "add", "br0", "type", "bridge")
            _ip("-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
    except RuntimeError as error:
        return f"cannot build a network namespace here: {error}"
    return None


@functools.cache
def shaping_unavailable() -> str | None:
    """Why `Network.throttle` and `Network.drop` cannot work here, or None: they need the
    tbf qdisc and nftables (`nft`, Debian package nftables), not netem."""
    if reason := netns_unavailable():
        return reason
    if shutil.which("nft") is None:
        return "no `nft` here (Debian: apt-get install nftables)"
    with _scratch_namespace() as name:
        done = _tc(name, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1mbit",
                   "burst", "32kbit", "latency", "400ms", check=False)  # fmt: skip
        if done.returncode != 0:
            return f"no tbf qdisc in this kernel ({done.stderr.strip()})"
        table = subprocess.run(["ip", "netns", "exec", name, "nft", "add", "table", "inet",
                                "probe"], capture_output=True, text=True)  # fmt: skip
        if table.returncode != 0:
            return f"no nftables in this kernel ({table.stderr.strip()})"
    return None


@dataclass(frozen=True)
class Host:
    """One namespace on the switch: `name` is h1, h2, ...; `address` its IPv4 address."""

    name: str
    namespace: str
    address: str


class Network:
    """Hosts on one switch and the faults a test can inflict on them; see `network`."""

    def __init__(self, tag: str, count: int) -> None:
        self.switch = f"{tag}-sw"
        self.hosts = [Host(f"h{i}", f"{tag}-h{i}", f"{SUBNET}.{i}") for i in range(1, count + 1)]

    def command(self, host: Host, argv: list[str]) -> list[str]:
        """`argv` run inside `host`; `ip netns exec` execs it, so its pid is the process's
        and the environment passes through (start Python with sys.executable)."""
        return ["ip", "netns", "exec", host.namespace, *argv]

    def cut(self, host: Host) -> None:
        """Pull the host's cable: its port on the switch goes down, packets are lost."""
        _ip("-n", self.switch, "link", "set", host.name, "down")

    def heal(self, host: Host) -> None:
        """Plug the host's cable back in."""
        _ip("-n", self.switch, "link", "set", host.name, "up")
        self._forget_neighbours()

    def partition(self, hosts: Iterable[Host]) -> None:
        """Split the switch in two: `hosts` reach each other and no one else."""
        for host in hosts:
            _ip("-n", self.switch, "link", "set", host.name, "master", "br1")

    def heal_partition(self) -> None:
        """Every host back on the one bridge."""
        for host in self.hosts:
            _ip("-n", self.switch, "link", "set", host.name, "master", "br0")
        self._forget_neighbours()

    def _forget_neighbours(self) -> None:
        """Drop the hosts' ARP entries: one that failed during a fault would otherwise
        fail the first connection after healing with EHOSTUNREACH (for up to ~3 s)."""
        for host in self.hosts:
            _ip("-n", host.namespace, "neigh", "flush", "all")

    def throttle(self, host: Host, rate_mbit: float) -> None:
        """Limit the host's link to `rate_mbit` each way (a token bucket, tbf): a frame of
        B bytes takes 8 * B / rate longer, as over a slow WAN link."""
        spec = ["tbf", "rate", f"{rate_mbit}mbit", "burst", "32kbit", "latency", "1s"]
        for namespace, device in self._ends(host):
            _tc(namespace, "qdisc", "replace", "dev", device, "root", *spec)

    def drop(self, host: Host, loss_pct: int) -> None:
        """Drop `loss_pct` percent of the packets the host receives, at random (nftables);
        TCP retransmits them, so the link stays up but stalls now and then."""
        rule = "drop" if loss_pct >= 100 else f"numgen random mod 100 < {loss_pct} drop"
        rules = (
            "table inet pcp_loss {\n"
            f"  chain input {{ type filter hook input priority 0; {rule}; }}\n"
            "}\n"
        )
        subprocess.run(["ip", "netns", "exec", host.namespace, "nft", "-f", "-"],
                       input=rules, text=True, check=True)  # fmt: skip

    def clear_shaping(self, host: Host) -> None:
        """Undo `throttle` and `drop`: the host's link at full speed again."""
        for namespace, device in self._ends(host):
            _tc(namespace, "qdisc", "del", "dev", device, "root", check=False)
        subprocess.run(["ip", "netns", "exec", host.namespace, "nft", "delete", "table",
                        "inet", "pcp_loss"], capture_output=True)  # fmt: skip

    def _ends(self, host: Host) -> list[tuple[str, str]]:
        return [(self.switch, host.name), (host.namespace, "eth0")]

    def build(self) -> None:
        """The switch's two bridges, then each host: its namespace, veth pair, address."""
        _ip("netns", "add", self.switch)
        for bridge in ("br0", "br1"):  # br1 holds one side of a partition
            _ip("-n", self.switch, "link", "add", bridge, "type", "bridge")
            _ip("-n", self.switch, "link", "set", bridge, "up")
        for host in self.hosts:
            _ip("netns", "add", host.namespace)
            _ip("-n", self.switch, "link", "add", host.name, "type", "veth",
                "peer", "name", "eth0", "netns", host.namespace)  # fmt: skip
            _ip("-n", self.switch, "link", "set", host.name, "master", "br0", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")

    def destroy(self) -> None:
        """Kill every process left in the hosts, then remove the namespaces (and with them
        the bridge and the veth pairs)."""
        _remove([h.namespace for h in self.hosts] + [self.switch])


def _remove(namespaces: list[str]) -> None:
    for namespace in namespaces:
        pids = _ip("netns", "pids", namespace, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    for namespace in namespaces:
        _ip("netns", "del", namespace, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def remove_stale() -> None:
    """Remove the namespaces of earlier runs whose process is gone (a crash, a kill -9)."""
    stale = []
    for entry in NETNS_DIR.glob(f"{PREFIX}*") if NETNS_DIR.is_dir() else []:
        pid = entry.name.removeprefix(PREFIX).split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            stale.append(entry.name)
    _remove(stale)


@contextlib.contextmanager
def network(count: int) -> Iterator[Network]:
    """`count` hosts, 10.77.0.1 to 10.77.0.`count`, on one switch; all of it, and every
    process still running in it, gone at the end, whatever happened in between."""
    if not 1 <= count <= 253:
        raise ValueError(f"a network has 1 to 253 hosts, not {count}")
    remove_stale()
    net = Network(f"{PREFIX}{os.getpid()}-{next(_serial)}", count)
    try:
        net.build()
        yield net
    finally:
        net.destroy()
