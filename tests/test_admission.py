"""Admission's compile control and its refusals, without sockets: one compile per
(backend, arch), none of them under a lock that other joins wait on, and only what the
shepherd serves."""

import queue
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from pcp_core.backends import Backend
from pcp_core.shepherd import admission
from pcp_core.shepherd.admission import Admission
from pcp_core.shepherd.builds import Builds
from pcp_core.wire.auth import SharedSecret


class FakeRuntime:
    """A runtime whose build is a function of the test's."""

    kind = "fake"

    def __init__(self, build: Any) -> None:
        self.build = lambda program, backend, arch: build(program.stablehlo, backend, arch)


def backend(name: str, build: Any = None) -> Backend:
    return Backend(
        name=name,
        default_arch="generic",
        runtime=FakeRuntime(build),  # type: ignore[arg-type]
    )


def make_admission(serves: tuple[str, ...] = ()) -> Admission:
    setup = SimpleNamespace(program=SimpleNamespace(stablehlo="module {}"))
    return Admission(setup, None, SharedSecret(b"secret"), None, {}, 1.0, serves=serves)  # type: ignore[arg-type]


def test_compiles_of_other_kinds_do_not_wait_and_one_kind_compiles_once() -> None:
    release_slow = threading.Event()
    calls: list[tuple[str, str]] = []

    def fake_compile(stablehlo: str, target: Backend, arch: str) -> Any:
        calls.append((target.name, arch))
        if target.name == "slow":
            assert release_slow.wait(30), "the slow compile was never released"
        return f"{target.name}/{arch}"

    joins = make_admission()
    results: dict[str, Any] = {}

    def join(name: str, key: str) -> None:
        results[key] = joins.provisioning.program_for(backend(name, fake_compile), "arch0")

    slow = [threading.Thread(target=join, args=("slow", f"slow{i}")) for i in range(3)]
    for thread in slow:
        thread.start()
    fast = threading.Thread(target=join, args=("fast", "fast"))
    fast.start()
    fast.join(10)
    assert results.get("fast") == "fast/arch0", "a join of another kind waited for a compile"
    release_slow.set()
    for thread in slow:
        thread.join(10)
    assert [results[f"slow{i}"] for i in range(3)] == ["slow/arch0"] * 3
    assert sorted(calls) == [("fast", "arch0"), ("slow", "arch0")]  # once per kind


def test_a_failed_compile_reaches_every_worker_of_that_kind() -> None:
    calls = []

    def failing(stablehlo: str, target: Backend, arch: str) -> Any:
        calls.append(arch)
        raise admission.CompileError("no such flag")

    joins = make_admission()
    for _ in range(2):
        with pytest.raises(admission.CompileError, match="no such flag"):
            joins.provisioning.program_for(backend("cpu", failing), "generic")
    assert calls == ["generic"]


@pytest.mark.parametrize(
    ("serves", "backend_name", "arch", "refusal"),
    [
        ((), "cpu", "x86-64-v4", None),
        (("cpu",), "cpu", "x86-64-v4", None),
        (("cuda:sm_80", "cpu"), "cuda", "sm_80", None),
        (("cuda:sm_80",), "cuda", "sm_86", "serves only cuda:sm_80, not cuda:sm_86"),
        (("cuda",), "cpu", "x86-64-v4", "serves only cuda, not cpu:x86-64-v4"),
        ((), "cpu", "sm_80 --iree-flag", "is not a valid name"),
        ((), "cpu", "", "is not a valid name"),
        ((), "cpu", "x" * 65, "is not a valid name"),
    ],
)
def test_what_the_shepherd_serves(
    serves: tuple[str, ...], backend_name: str, arch: str, refusal: str | None
) -> None:
    joins = make_admission(serves)
    if refusal is None:
        joins._check_served(backend_name, arch)
    else:
        with pytest.raises(ValueError, match=refusal):
            joins._check_served(backend_name, arch)


def test_an_ending_shepherd_waits_for_the_builds_in_flight() -> None:
    """jax aborts the process when it exits while another thread is inside it: a
    shepherd stopped mid-export (Ctrl-C) first lets the export finish."""
    builds, inside, finished = Builds(), threading.Event(), []

    def build() -> None:
        with builds.running():
            inside.set()
            time.sleep(0.5)
            finished.append(True)

    threading.Thread(target=build).start()
    assert inside.wait(10)
    builds.end(grace_s=30)
    assert finished == [True]
    builds.end(grace_s=30)  # nothing in flight: returns at once


@pytest.mark.parametrize("being_served", [True, False])
def test_the_join_timeout_spares_a_worker_being_served(being_served: bool) -> None:
    """A worker that connected while its program compiles has joined in all but name: the
    join timeout does not give up on it; with no one being served, it does."""
    from pcp_core.shepherd.roster import NotEnoughWorkers
    from pcp_core.shepherd.session import Shepherd

    serving = threading.Event()
    if being_served:
        serving.set()
    joins = SimpleNamespace(joined=queue.Queue(), joining=serving.is_set)
    link = SimpleNamespace(index=0, hello=SimpleNamespace(worker_name="w0"))

    def served_late() -> None:
        time.sleep(1.5)  # past the 0.3 s timeout
        joins.joined.put(link)
        serving.clear()

    threading.Thread(target=served_late, daemon=True).start()
    shepherd = Shepherd(joins)  # type: ignore[arg-type]
    if being_served:
        shepherd.wait_for_workers(1, timeout_s=0.3)
        assert shepherd.links == {0: link}
    else:
        with pytest.raises(NotEnoughWorkers, match="only 0 of 1 workers connected within 0 s"):
            shepherd.wait_for_workers(1, timeout_s=0.3)
