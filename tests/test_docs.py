"""The plugin guide documents every extension point the core defines."""

import inspect
from pathlib import Path

from pcp_core import hookspecs

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def test_every_hook_has_a_reference_section() -> None:
    hooks = [
        name
        for name, value in inspect.getmembers(hookspecs, inspect.isfunction)
        if name.startswith("pcp_")
    ]
    assert hooks, "no hooks found in hookspecs.py"
    headings = {
        line[4:].strip() for line in GUIDE.read_text().splitlines() if line.startswith("### ")
    }
    missing = [name for name in hooks if name not in headings]
    assert not missing, f"docs/plugins.md has no '### <hook>' section for {missing}"


def test_every_conformance_suite_is_documented() -> None:
    from pcp_core.testing import SUITES

    guide = GUIDE.read_text()
    missing = [name for name in SUITES if f"`{name}`" not in guide]
    assert not missing, f"docs/plugins.md does not describe {missing}"


def test_every_name_of_the_engine_is_documented() -> None:
    from pcp_core import engine

    guide = GUIDE.read_text()
    missing = [name for name in engine.__all__ if f"`{name}" not in guide]
    assert not missing, f"docs/plugins.md, 'The engine', does not name {missing}"
