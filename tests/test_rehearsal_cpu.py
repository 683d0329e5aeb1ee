"""CPU quotas for rehearsed workers (pcp_core.rehearsal.cpu): a process started into a
quota's cgroup gets no more CPU time than the quota, and the groups go away after.
Needs root and a cgroup cpu controller; skips cleanly without them."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from pcp_core.rehearsal.cpu import CpuQuotaError, cpu_groups, quota_problem

SPIN = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass\n"


@pytest.fixture
def quotas_work() -> None:
    problem = quota_problem()
    if problem is not None:
        pytest.skip(problem)


@pytest.mark.slow
def test_a_process_in_a_quota_gets_no_more_cpu_than_the_quota(quotas_work: None) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with cpu_groups({"w": 0.2}, f"test-{os.getpid()}") as groups:
        group = groups.groups["w"]
        started = time.monotonic()
        subprocess.run([sys.executable, "-c", SPIN], check=True, preexec_fn=groups.joiner("w"))
        elapsed = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    # Unlimited, the spin would use about all of its wall time. In the group it gets a
    # fifth of a core for as long as it lives (interpreter start-up included, which a
    # loaded machine makes long), give or take a few scheduler periods.
    assert elapsed >= 1.5
    assert 0 < used <= 0.2 * elapsed + 0.1, (used, elapsed)
    assert not group.exists() and not group.parent.exists()


def test_no_quota_needs_no_cgroup_and_a_worker_without_one_starts_as_it_is() -> None:
    with cpu_groups({}, "unused") as groups:
        assert groups.joiner("anyone") is None


def test_without_a_cpu_controller_the_error_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from pcp_core.rehearsal import cpu

    monkeypatch.setattr(cpu, "cpu_hierarchy", lambda root=None: None)
    with pytest.raises(CpuQuotaError, match="no writable cgroup cpu controller"):
        cpu.CpuGroups({"w": 0.5}, "x")


def test_groups_a_killed_rehearsal_left_are_removed_by_the_next(quotas_work: None) -> None:
    from pcp_core.rehearsal.cpu import cpu_hierarchy, remove_stale

    hierarchy, _ = cpu_hierarchy()
    left = hierarchy / "pcp-999999999-0"  # no such pid
    (left / "w").mkdir(parents=True)
    remove_stale()
    assert not left.exists()
