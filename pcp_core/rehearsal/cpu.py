"""CPU quotas for rehearsed workers: a slower machine made real, by the kernel.

A scenario worker with `cpus = 0.25` runs in a cgroup of its own whose CPU bandwidth is
a quarter of one core (the scheduler's quota over its period), so its inner steps take
about four times as long as an unlimited worker's on an idle core; nothing in PCP's code
is slowed. cgroup v1's cpu controller (`cpu.cfs_quota_us`) and cgroup v2's (`cpu.max`)
both work; the groups live under `pcp-<tag>` (the network's tag, which starts with the
rehearsal's pid) and are removed with the network, or by the next rehearsal where a
killed one left them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The scheduler's period for a quota (the kernel's default is 100 ms): a group gets its
# share of each period, then waits for the next. 20 ms keeps a slow worker slow evenly,
# not in bursts of full speed and long stops, even over rounds of a second.
PERIOD_US = 20_000


class CpuQuotaError(RuntimeError):
    """CPU quotas cannot be set here; the message says why."""


def cpu_hierarchy(root: Path = CGROUP_ROOT) -> tuple[Path, int] | None:
    """Where cgroups with a CPU quota can be made, and the cgroup version; None where
    no writable cpu controller is mounted."""
    v1 = root / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return v1, 1
    for v2 in (root, root / "unified"):
        controllers = v2 / "cgroup.controllers"
        listed = controllers.exists() and "cpu" in controllers.read_text().split()
        if listed and os.access(v2, os.W_OK):
            return v2, 2
    return None


def quota_problem() -> str | None:
    """Why CPU quotas cannot be set here, or None."""
    if cpu_hierarchy() is None:
        return (
            f"no writable cgroup cpu controller under {CGROUP_ROOT} (cgroup v1 `cpu` or v2 "
            "with `cpu` in cgroup.controllers, as root)"
        )
    return None


class CpuGroups:
    """One cgroup per quota-limited worker; `joiner(name)` puts a starting process in it."""

    def __init__(self, quotas: dict[str, float], tag: str) -> None:
        self.groups: dict[str, Path] = {}
        self.parent: Path | None = None
        if not quotas:
            return
        found = cpu_hierarchy()
        if found is None:
            raise CpuQuotaError(quota_problem() or "no cpu controller")
        hierarchy, version = found
        remove_stale()
        try:
            self.parent = hierarchy / f"pcp-{tag}"
            self.parent.mkdir(exist_ok=True)
            if version == 2:
                _write(self.parent / "cgroup.subtree_control", "+cpu")
            for name, cpus in quotas.items():
                self.groups[name] = group = self.parent / name
                group.mkdir(exist_ok=True)
                quota = max(int(cpus * PERIOD_US), 1000)
                if version == 1:
                    _write(group / "cpu.cfs_period_us", str(PERIOD_US))
                    _write(group / "cpu.cfs_quota_us", str(quota))
                else:
                    _write(group / "cpu.max", f"{quota} {PERIOD_US}")
        except (OSError, CpuQuotaError):
            self.remove()
            raise

    def joiner(self, name: str) -> Callable[[], None] | None:
        """A `preexec_fn` that moves the new process into `name`'s group before it runs
        (its children are born there too); None for a worker without a quota."""
        group = self.groups.get(name)
        if group is None:
            return None
        procs = str(group / "cgroup.procs")

        def join() -> None:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))

        return join

    def remove(self, wait_s: float = 5.0) -> None:
        """Remove the groups, waiting up to `wait_s` for their last processes to end."""
        deadline = time.monotonic() + wait_s
        for group in [*self.groups.values(), self.parent]:
            while group is not None and group.exists():
                try:
                    group.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)


def remove_stale(root: Path = CGROUP_ROOT) -> None:
    """Remove the empty groups a killed rehearsal left (`pcp-<pid>-...` of a dead pid)."""
    found = cpu_hierarchy(root)
    if found is None:
        return
    for parent in found[0].glob("pcp-*"):
        owner = parent.name.split("-")[1]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            for group in [*(p for p in parent.iterdir() if p.is_dir()), parent]:
                with contextlib.suppress(OSError):
                    group.rmdir()


@contextlib.contextmanager
def cpu_groups(quotas: dict[str, float], tag: str) -> Iterator[CpuGroups]:
    """The groups for `quotas` (worker name -> cores), removed on the way out."""
    groups = CpuGroups(quotas, tag)
    try:
        yield groups
    finally:
        groups.remove()


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as error:
        raise CpuQuotaError(f"cannot write {value!r} to {path}: {error}") from None
