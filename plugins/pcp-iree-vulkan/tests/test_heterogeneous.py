"""One DiLoCo run with a CPU worker and a Vulkan worker, each on its own compiled program."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pcp_core import plugins
from pcp_core.backends import DeviceError
from pcp_core.iree.executor import open_device
from pcp_core.registry import UnknownNameError

TINY = [
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--n-embd",
    "32",
    "--block-size",
    "16",
    "--batch-size",
    "4",
]


def test_cpu_and_vulkan_workers_train_together(tmp_path: Path) -> None:
    try:
        open_device("vulkan")
        plugins.host().algorithm("diloco")
    except (DeviceError, UnknownNameError) as error:
        pytest.skip(f"cannot run a heterogeneous DiLoCo run here: {error}")
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "pcp_core",
        "train",
        "--algorithm",
        "diloco",
        "--worker-backends",
        "cpu,vulkan",
        "--steps",
        "30",
        "--inner-steps",
        "10",
        "--eval-every",
        "10",
        "--out",
        str(out),
        *TINY,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    compiled = {
        line.split("backend=")[1].split()[0]
        for line in result.stderr.splitlines()
        if "backend=" in line and "compil" in line
    }
    assert compiled == {"cpu", "vulkan"}  # one program per backend
    joined = [line for line in result.stderr.splitlines() if "worker joined" in line]
    assert any("vulkan/vp_android_baseline_2022" in line for line in joined)
    assert any(", cpu/" in line for line in joined)  # the label: (name, backend/arch)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["workers"] for r in records] == [2, 2, 2]
    assert records[-1]["val_loss"] < records[0]["val_loss"]
