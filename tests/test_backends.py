"""A backend detects the architecture of the device it was given, not of the first one."""

import os
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from pcp_core import exit_codes
from pcp_core.backends import Backend, DeviceReport, auto_backend, iree_device_dump
from pcp_core.iree.runtime import IreeRuntime
from pcp_core.testing import install_fake_plugin
from tests.conftest import run_pcp


def backend(detect_arch) -> Backend:
    runtime = IreeRuntime(target="llvm-cpu", driver="local-task")
    return Backend("fake", runtime, "generic", detect_arch=detect_arch)


def test_detection_is_asked_about_the_given_device() -> None:
    asked: list[int] = []

    def detect_arch(device: int) -> str:
        asked.append(device)
        return f"arch-of-{device}"

    fake = backend(detect_arch)
    assert fake.resolve_arch(None, 2) == "arch-of-2"
    assert fake.resolve_arch() == "arch-of-0"  # no device given: the first, as --device
    assert fake.resolve_arch("chosen", 2) == "chosen"  # --target wins, nothing detected
    assert asked == [2, 0]


def test_nothing_detected_gives_the_default() -> None:
    assert backend(lambda device: None).resolve_arch(None, 1) == "generic"


def test_a_detect_arch_without_a_device_still_works() -> None:
    """Backends written before detection took a device: called as before, and a worker on
    another device than the first is told that the answer may not be its device's."""
    fake = backend(lambda: "old-style")
    with capture_logs() as first:
        assert fake.resolve_arch(None, 0) == "old-style"
    assert first == []
    with capture_logs() as other:
        assert fake.resolve_arch(None, 1) == "old-style"
    assert [e["log_level"] for e in other] == ["warning"]
    assert "--target" in other[0]["event"] and other[0]["device"] == 1


def test_the_device_dump_reads_cuda_and_hip_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """IREE's CUDA and HIP drivers print "- key: value" (seen on an H100, IREE 3.13)."""
    dump = (
        "# --device=cuda://GPU-aaaa\n#   NVIDIA H100 80GB HBM3\n\n"
        "- gpu-compute-capability: 9.0\n- gpu-warp-size: 32\n"
        "# --device=cuda://GPU-bbbb\n#   NVIDIA GeForce RTX 3090\n\n"
        "- gpu-compute-capability: 8.6\n"
    )
    monkeypatch.setattr("pcp_core.backends.run_quietly", lambda command, **_: dump)
    devices = iree_device_dump("cuda")
    assert [d["gpu-compute-capability"] for d in devices] == ["9.0", "8.6"]


PLUGIN = """
import sys
from pcp_core import hookimpl
from pcp_core.backends import Backend
from pcp_core.iree.runtime import IreeRuntime

PCP_PLUGIN_API = 5

def detect_arch({parameters}):
    print(f"detect_arch was asked about device {asked}", file=sys.stderr)
    return "generic"

@hookimpl
def pcp_register_backends(register):
    register(Backend("fake", IreeRuntime(target="llvm-cpu", driver="local-task"), "generic",
                     detect_arch=detect_arch))
"""


@pytest.mark.parametrize(
    ("parameters", "asked", "warned"),
    [("device", "{device}", False), ("", "none", True)],
    ids=["takes-a-device", "takes-none"],
)
def test_a_worker_detects_its_own_device(
    tmp_path: Path, parameters: str, asked: str, warned: bool
) -> None:
    """`pcp worker --device 3`: detection is asked about device 3 (this machine's one CPU
    device then stops the worker, as a missing GPU would)."""
    source = PLUGIN.format(parameters=parameters, asked=asked)
    install_fake_plugin(tmp_path / "site", "pcp-fake-backend", "pcp_fake_backend", source)
    result = run_pcp(
        *("worker", "--backend", "fake", "--device", "3", "--restarts", "0"),
        *("--connect", "127.0.0.1:1", "--state-dir", str(tmp_path / "state")),
        env={
            "PYTHONPATH": os.pathsep.join(
                [str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]
            ),
            "PCP_STRICT_PLUGINS": "",
        },
    )
    assert result.returncode == exit_codes.CONFIGURATION, result.stderr
    assert "no device 3" in result.stderr
    if warned:
        assert "detect_arch was asked about device none" in result.stderr
        assert "detects one architecture for all its devices" in result.stderr
    else:
        assert "detect_arch was asked about device 3" in result.stderr


class CountingRuntime:
    """A runtime that reports `count` devices."""

    def __init__(self, count: int) -> None:
        self.count = count

    def describe_devices(self, backend: Any) -> DeviceReport:
        devices = [f"{i}: gpu" for i in range(self.count)]
        return DeviceReport(backend.name, "counting", True, devices, "a")


def test_local_workers_of_one_backend_take_its_devices_in_turn() -> None:
    from types import SimpleNamespace

    from pcp_core.config import SHEPHERD, RunConfig, ShepherdSettings
    from pcp_core.shepherd.distributed import local_devices

    backends = {
        name: Backend(name, CountingRuntime(count), "a")  # type: ignore[arg-type]
        for name, count in (("gpu2", 2), ("one", 1))
    }
    plugins = SimpleNamespace(backend=backends.__getitem__)
    config = RunConfig(
        plugins={SHEPHERD: ShepherdSettings(worker_backends="gpu2,one,gpu2,gpu2,one")}
    )
    assert local_devices(config, plugins) == [0, 0, 1, 0, 0]
    config = RunConfig(plugins={SHEPHERD: ShepherdSettings(worker_backends="gpu2,one")})
    assert local_devices(config, plugins) == [None, None]  # one each: nothing to spread
    config = RunConfig(device=1, plugins={SHEPHERD: ShepherdSettings(worker_backends="gpu2,gpu2")})
    assert local_devices(config, plugins) == [1, 1]


def report(name: str, devices: list[str], arch: str = "x", available: bool = True) -> Any:
    return DeviceReport(name, "r", available, devices, arch, "")


def test_auto_takes_the_fastest_backend_with_a_real_device() -> None:
    cpu_only = [report("cpu", ["0: host"]), report("xla", ["0: cpu"], arch="cpu")]
    assert auto_backend(cpu_only) == "cpu"
    lavapipe = [*cpu_only, report("vulkan", ["0: llvmpipe (LLVM 15)"])]
    assert auto_backend(lavapipe) == "cpu"
    gpu = [*lavapipe, report("cuda", ["0: H100"]), report("xla", ["0: cuda:0"], arch="cuda")]
    assert auto_backend(gpu[:-1]) == "cuda" and auto_backend(gpu[1:]) == "xla"
    assert auto_backend([report("cpu", [], available=False)]) is None
