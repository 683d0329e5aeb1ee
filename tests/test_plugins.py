"""Plugin discovery through real entry points, in fresh interpreters."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pcp_core.testing import install_fake_plugin
from tests.conftest import run_pcp

GOOD = """
from pcp_core import hookimpl
from pcp_core.backends import Backend
from pcp_core.iree.runtime import IreeRuntime

PCP_PLUGIN_API = 5

@hookimpl
def pcp_register_backends(register):
    register(Backend(name="fake", default_arch="generic",
                     runtime=IreeRuntime(target="llvm-cpu", driver="local-sync")))
"""

BROKEN = "raise ImportError('this plugin is broken on purpose')\n"

DUPLICATE = """
from pcp_core import hookimpl
from pcp_core.backends import Backend
from pcp_core.iree.runtime import IreeRuntime

PCP_PLUGIN_API = 5

@hookimpl
def pcp_register_backends(register):
    register(Backend(name="cpu", default_arch="generic",
                     runtime=IreeRuntime(target="llvm-cpu", driver="local-sync")))
"""


def plugin_env(site: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "PCP_STRICT_PLUGINS": "", **extra}


def listed(result: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert result.returncode == 0, result.stderr
    return {r["distribution"]: r for r in json.loads(result.stdout)}


@pytest.fixture
def site(tmp_path: Path) -> Path:
    install_fake_plugin(tmp_path, "pcp-fake-backend", "pcp_fake_backend", GOOD)
    return tmp_path


def test_installed_plugin_is_discovered(site: Path) -> None:
    records = listed(run_pcp("plugins", "--json", env=plugin_env(site)))
    assert ["backend", "fake"] in records["pcp-fake-backend"]["registered"]
    assert records["pcp-fake-backend"]["version"] == "1.0"
    assert ["algorithm", "local"] in records["pcp-core"]["registered"]


def test_broken_plugin_is_reported_not_fatal(site: Path) -> None:
    install_fake_plugin(site, "pcp-broken", "pcp_broken", BROKEN)
    records = listed(run_pcp("plugins", "--json", env=plugin_env(site)))
    assert "broken on purpose" in records["pcp-broken"]["errors"][0]
    assert ["backend", "fake"] in records["pcp-fake-backend"]["registered"]
    table = run_pcp("plugins", env=plugin_env(site, COLUMNS="300"))
    assert table.returncode == 0 and "broken on purpose" in table.stdout


def test_strict_mode_fails_on_broken_plugin(site: Path) -> None:
    install_fake_plugin(site, "pcp-broken", "pcp_broken", BROKEN)
    result = run_pcp("plugins", env=plugin_env(site, PCP_STRICT_PLUGINS="1"))
    assert result.returncode != 0
    assert "pcp-broken" in result.stderr and "broken on purpose" in result.stderr


@pytest.mark.parametrize(
    ("declaration", "reason"),
    [("PCP_PLUGIN_API = 99", "written for plugin API 99"), ("", "declares no PCP_PLUGIN_API")],
)
def test_plugin_for_another_api_is_listed_not_loaded(
    site: Path, declaration: str, reason: str
) -> None:
    source = GOOD.replace("PCP_PLUGIN_API = 5", declaration).replace('"fake"', '"future"')
    install_fake_plugin(site, "pcp-future", "pcp_future", source)
    records = listed(run_pcp("plugins", "--json", env=plugin_env(site)))
    assert records["pcp-future"]["registered"] == []
    assert reason in records["pcp-future"]["errors"][0]
    assert "plugin API 5" in records["pcp-future"]["errors"][0]
    result = run_pcp("train", "--backend", "future", env=plugin_env(site))
    assert result.returncode == 2 and "unknown backend 'future'" in result.stderr


def test_only_and_disable_filters(site: Path) -> None:
    install_fake_plugin(site, "pcp-broken", "pcp_broken", BROKEN)
    only = listed(
        run_pcp("plugins", "--json", env=plugin_env(site, PCP_PLUGINS="pcp-fake-backend"))
    )
    assert set(only) == {"pcp-core", "pcp-fake-backend"}
    disabled = listed(
        run_pcp("plugins", "--json", env=plugin_env(site, PCP_DISABLE_PLUGINS="pcp-broken,pcp_cpu"))
    )
    assert "pcp-broken" not in disabled and "pcp-cpu" not in disabled
    assert "pcp-fake-backend" in disabled


def test_duplicate_name_is_a_clear_error(site: Path) -> None:
    install_fake_plugin(site, "pcp-dup", "pcp_dup", DUPLICATE)
    records = listed(run_pcp("plugins", "--json", env=plugin_env(site)))
    errors = [e for r in records.values() for e in r["errors"]]
    assert any("pcp-cpu" in e and "pcp-dup" in e for e in errors), errors
    result = run_pcp("train", "--backend", "cpu", env=plugin_env(site))
    assert result.returncode == 2
    assert "pcp-cpu" in result.stderr and "pcp-dup" in result.stderr


def test_unknown_backend_lists_installed_and_pip_line() -> None:
    result = run_pcp("train", "--backend", "rocm", env={"PCP_DISABLE_PLUGINS": "pcp-iree-rocm"})
    assert result.returncode == 2
    assert "unknown backend 'rocm'" in result.stderr
    assert "cpu" in result.stderr and "pip install pcp-iree-rocm" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_pcp("train", "--backend", "nonsense")
    assert result.returncode == 2 and "pip install" not in result.stderr


@pytest.mark.parametrize("args", [["--help"], ["plugins"]])
def test_cli_stays_light(args: list[str]) -> None:
    """`pcp --help` and `pcp plugins` must not import jax, iree or capnp."""
    probe = (
        "import sys\nfrom pcp_core.cli import app as cli\nsys.argv = ['pcp', *sys.argv[1:]]\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'iree', 'capnp'})\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True)
    assert "HEAVY []" in result.stderr, result.stderr
