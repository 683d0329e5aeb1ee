"""Test sessions. `nox` runs the default ones (lint + tests); the rest by name:

nox -s slow          # slow end-to-end tests (multi-GiB payloads, long runs)
nox -s plugin        # each plugin alone on top of the core: the install matrix
"""

import tomllib
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

PLUGINS = sorted(p.name for p in Path("plugins").iterdir() if (p / "pyproject.toml").is_file())


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    session.install("-r", "requirements-dev.txt")
    session.run("pytest", "-q", *session.posargs)


@nox.session(python="3.11")
def slow(session: nox.Session) -> None:
    session.install("-r", "requirements-dev.txt")
    session.run("pytest", "-q", "-m", "slow", *session.posargs)


def local_requirements(plugin: str) -> list[str]:
    """This repository's plugins that `plugin` depends on, recursively, as -e arguments."""
    project = tomllib.loads(Path(f"plugins/{plugin}/pyproject.toml").read_text())["project"]
    names = [d.split("=")[0].strip() for d in project.get("dependencies", [])]
    found = [n for n in names if n in PLUGINS]
    return [arg for n in found for arg in (*local_requirements(n), "-e", f"plugins/{n}")]


@nox.session(python="3.11")
@nox.parametrize("plugin", PLUGINS)
def plugin(session: nox.Session, plugin: str) -> None:
    """One plugin with the core and only what it needs (pcp-cpu and pcp-adamw to run)."""
    session.install("-e", ".[test]", "-e", "plugins/pcp-cpu", "-e", "plugins/pcp-adamw")
    session.install(*local_requirements(plugin), "-e", f"plugins/{plugin}")
    session.run("pytest", "-q", f"plugins/{plugin}", env={"PCP_STRICT_PLUGINS": "1"})
