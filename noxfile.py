"""Test sessions. `nox` runs the default ones (lint + tests); the rest by name:

nox -s slow          # slow end-to-end tests (multi-GiB payloads, long runs)
nox -s plugin        # each plugin alone on top of the core: the install matrix
"""

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


@nox.session(python="3.11")
@nox.parametrize("plugin", PLUGINS)
def plugin(session: nox.Session, plugin: str) -> None:
    """One plugin installed alone with the core (+ pcp-cpu/pcp-adamw it may need to run)."""
    session.install("-e", ".[test]", "-e", "plugins/pcp-cpu", "-e", "plugins/pcp-adamw")
    session.install("-e", f"plugins/{plugin}")
    session.run("pytest", "-q", f"plugins/{plugin}", env={"PCP_STRICT_PLUGINS": "1"})
