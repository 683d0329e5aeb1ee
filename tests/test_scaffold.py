"""`pcp plugin new`: the package it writes, and the names and places it refuses.

That every generated package installs and passes its own tests in a fresh
environment is checked by `nox -s scaffold`.
"""

import tomllib
from pathlib import Path

import pytest

from pcp_core.cli.scaffold import KINDS
from tests.conftest import run_pcp


@pytest.mark.parametrize("kind", KINDS)
def test_writes_an_installable_package(tmp_path: Path, kind: str) -> None:
    result = run_pcp("plugin", "new", f"my-{kind}", "--kind", kind, "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    root = tmp_path / f"pcp-my-{kind}"
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    module = f"pcp_my_{kind}"
    assert project["name"] == f"pcp-my-{kind}"
    assert project["entry-points"]["pcp"] == {f"my-{kind}": module}
    assert any(d.startswith("pcp-core==") for d in project["dependencies"])
    source = (root / module / "__init__.py").read_text()
    assert "PCP_PLUGIN_API = 5" in source and f'"my-{kind}"' in source
    compile(source, module, "exec")
    assert "Conformance" in (root / "tests" / f"test_{kind}.py").read_text()
    usage = f"pcp launch my-{kind}" if kind == "launcher" else f"--{kind} my-{kind}"
    assert usage in (root / "README.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["My_Plugin", "--kind", "model"], "use lowercase letters"),
        (["ok", "--kind", "gizmo"], "unknown kind 'gizmo'"),
    ],
)
def test_refuses_bad_names_and_kinds(tmp_path: Path, args: list[str], message: str) -> None:
    result = run_pcp("plugin", "new", *args, "--dir", str(tmp_path))
    assert result.returncode == 2 and message in result.stderr
    assert not any(tmp_path.iterdir())


def test_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "pcp-taken").mkdir()
    (tmp_path / "pcp-taken" / "mine.py").write_text("keep me")
    result = run_pcp("plugin", "new", "taken", "--kind", "model", "--dir", str(tmp_path))
    assert result.returncode == 2 and "already exists" in result.stderr
    assert (tmp_path / "pcp-taken" / "mine.py").read_text() == "keep me"
