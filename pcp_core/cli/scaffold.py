"""`pcp plugin new`: write a complete, installable plugin package to start from.

Each kind gets a working implementation, its conformance suite as the tests, a README
and a pyproject with the entry point, from the templates in `pcp_core/templates`.
"""

import re
from importlib import resources
from pathlib import Path
from string import Template

from pcp_core import __version__

KINDS = (
    "backend",
    "optimizer",
    "transport",
    "algorithm",
    "model",
    "dataset",
    "codec",
    "aggregator",
    "launcher",
)
NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")

# what the generated package needs beyond pcp-core, what its conformance suite needs
# (the CPU backend to compile on, AdamW for the reference run), and how a user tries it
EXTRA_DEPENDENCIES = {"optimizer": ["optax>=0.2.3"], "transport": ["pcp-capnp-tcp"]}
TEST_PLUGINS = {
    "backend": ["pcp-adamw"],
    "optimizer": ["pcp-cpu"],
    "algorithm": ["pcp-cpu", "pcp-adamw"],
    "model": ["pcp-cpu", "pcp-adamw"],
}
USAGE = {
    "backend": "pcp train --backend $name",
    "optimizer": "pcp train --optimizer $name",
    "transport": "pcp train --algorithm diloco --transport $name",
    "algorithm": "pcp train --algorithm $name --loss-goal 2.5   # --loss-goal: its own setting",
    "model": "pcp train --model $name --model-settings context=8,n_hidden=256",
    "dataset": "pcp train --dataset $name --data DIR_OF_TXT_FILES",
    "codec": "pcp train --algorithm diloco --codec $name",
    "aggregator": "pcp train --algorithm diloco --workers 4 --aggregator $name",
    "launcher": "pcp launch $name --workers 2 -- --steps 200   # --dry-run: write, not run",
}


class ScaffoldError(ValueError):
    """A name, kind or target directory `pcp plugin new` cannot use."""


def _template(name: str) -> Template:
    return Template((resources.files("pcp_core") / "templates" / name).read_text("utf-8"))


def new_plugin(name: str, kind: str, parent: Path) -> Path:
    """Write the package `pcp-NAME` for a plugin of `kind` under `parent`; return its path."""
    if not NAME.fullmatch(name):
        raise ScaffoldError(
            f"plugin name {name!r}: use lowercase letters, digits and single hyphens, "
            "starting with a letter (for example 'my-sgd')"
        )
    if kind not in KINDS:
        raise ScaffoldError(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    distribution, module = f"pcp-{name}", "pcp_" + name.replace("-", "_")
    root = parent / distribution
    if root.exists() and any(root.iterdir()):
        raise ScaffoldError(f"{root} already exists and is not empty")
    dependencies = [f"pcp-core=={__version__}", *EXTRA_DEPENDENCIES.get(kind, [])]
    values = {
        "name": name,
        "kind": kind,
        "distribution": distribution,
        "module": module,
        "dependencies": ", ".join(f'"{d}"' for d in dependencies),
        "test_dependencies": ", ".join(
            f'"{d}"'
            for d in ["pytest>=8", *(f"{p}=={__version__}" for p in TEST_PLUGINS.get(kind, []))]
        ),
        "usage": Template(USAGE[kind]).substitute(name=name),
    }
    files = {
        "pyproject.toml": "pyproject.toml.tmpl",
        "README.md": "README.md.tmpl",
        f"{module}/__init__.py": f"{kind}.py.tmpl",
        f"tests/test_{kind}.py": f"test_{kind}.py.tmpl",
    }
    for relative, template in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_template(template).substitute(values), encoding="utf-8")
    return root
