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


def core_with_standard_plugins() -> list[str]:
    """pcp-core and the plugins it depends on, from this checkout, as install arguments."""
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    standard = [d.split("=")[0] for d in project["dependencies"] if d.startswith("pcp-")]
    return ["-e", ".[test]", *(arg for name in standard for arg in ("-e", f"plugins/{name}"))]


@nox.session(python="3.11")
@nox.parametrize("plugin", PLUGINS)
def plugin(session: nox.Session, plugin: str) -> None:
    """One plugin with the core (and the standard plugins it brings) and what it declares."""
    session.install(*core_with_standard_plugins())
    session.install(*local_requirements(plugin), "-e", f"plugins/{plugin}")
    session.run("pytest", "-q", f"plugins/{plugin}", env={"PCP_STRICT_PLUGINS": "1"})
