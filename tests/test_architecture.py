"""The claims of docs/architecture.md, checked on the source: no import cycles counting
every import, arrows that point down the layers only, the plugin host passed below the
run layer and never fetched, modules and functions short enough to read, and algorithm
plugins that reach the core through the engine."""

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "pcp_core"

# Each folder (or top-level module) of pcp_core and its layer: a module may import its
# own folder and anything on a lower layer, never a higher one or a peer on its own.
# Top-level modules not named here are the plugin contracts (layer 0), which every
# folder may use.
LAYERS = {
    "cli": 10,
    "__main__": 10,
    "testing": 10,
    "rehearsal": 9,
    "run": 8,
    "engine": 8,  # what algorithm plugins import: shepherd/, worker/ and the plugin host
    "plugins": 7,  # the plugin host, and the core's own plugin that it registers first
    "builtin": 7,
    "launch": 6,
    "local": 6,
    "shepherd": 6,
    "worker": 5,
    "watch": 4,
    "iree": 4,
    "program": 3,
    "wire": 3,
    "data": 2,
}
ONE_UNIT = {"__main__": "cli", "builtin": "plugins"}  # a module that belongs with another

MAX_LINES = 350
# Modules still over MAX_LINES, to be split; the list may only shrink.
STILL_TOO_LONG: set[str] = set()
# Where the plugin host may be fetched (`plugins.host()`): the layers that start runs.
FETCH_HOST_IN = {"cli", "run", "testing"}


def core_modules() -> dict[str, Path]:
    modules = {}
    for path in CORE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


MODULES = core_modules()


def imports(name: str, path: Path) -> Iterator[tuple[str, bool]]:
    """The pcp_core modules `name` imports, anywhere in it, and whether for types only
    (under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    for_types = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1 more
                package = name.split(".") if path.stem == "__init__" else name.split(".")[:-1]
                parts = package[: len(package) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target, id(node) in for_types


GRAPH = {name: set(imports(name, path)) for name, path in MODULES.items()}


def unit(module: str) -> str:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return ONE_UNIT.get(top, top)


def layer(module: str) -> int:
    return LAYERS.get(unit(module), 0)


def test_no_import_cycles_counting_every_import() -> None:
    edges = {name: {target for target, _ in targets} for name, targets in GRAPH.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for target in sorted(edges[name]):
            visit(target, [*path, name])
        done.add(name)

    for name in sorted(edges):
        visit(name, [])


def test_imports_point_down_the_layers() -> None:
    """Imports that run; one for types only never runs, and may name a contract's type
    wherever it is defined (it still counts for cycles)."""
    upward = [
        f"{name} -> {target}"
        for name, targets in GRAPH.items()
        for target, for_types in targets
        if not for_types
        and unit(name) != unit(target)
        and layer(name) <= layer(target)
        and (layer(name), layer(target)) != (0, 0)
    ]
    assert not upward, "imports against the layers of docs/architecture.md:\n" + "\n".join(
        sorted(upward)
    )


def test_every_folder_has_a_layer() -> None:
    folders = {path.name for path in CORE.iterdir() if (path / "__init__.py").exists()}
    assert folders - {"templates"} <= set(LAYERS), folders - set(LAYERS)


def test_the_plugin_host_is_passed_not_fetched_below_the_run() -> None:
    fetching = [
        name
        for name, path in MODULES.items()
        if unit(name) not in FETCH_HOST_IN and name != "pcp_core.plugins"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).split(".")[-1] == "host"
        and not node.args
    ]
    assert not fetching, f"fetch the plugin host in {sorted(set(fetching))}: pass it in"


def test_production_code_never_imports_the_testing_kit() -> None:
    users = [
        name
        for name, targets in GRAPH.items()
        if unit(name) != "testing" and any(unit(t) == "testing" for t, _ in targets)
    ]
    assert not users


def production_sources() -> list[Path]:
    plugin_packages = [
        folder
        for base in (ROOT / "plugins", ROOT / "examples")
        for folder in base.glob("*/pcp_*")
        if folder.is_dir() and not folder.name.endswith(".egg-info")
    ]
    return [path for folder in (CORE, *plugin_packages) for path in folder.rglob("*.py")]


def test_modules_are_short_enough_to_read() -> None:
    lengths = {
        path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
        for path in production_sources()
    }
    too_long = {name for name, lines in lengths.items() if lines > MAX_LINES}
    assert too_long <= STILL_TOO_LONG, (
        f"over {MAX_LINES} lines: {sorted(too_long - STILL_TOO_LONG)}"
    )
    now_short = STILL_TOO_LONG - too_long
    assert not now_short, f"short enough now, take them off STILL_TOO_LONG: {sorted(now_short)}"


MAX_FUNCTION_LINES = 80


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines from its first statement after the docstring to its end: a CLI
    command's option list, its signature, does not count."""
    body = function.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return (function.end_lineno or function.lineno) - body[0].lineno + 1


def test_functions_are_short_enough_to_read() -> None:
    too_long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({body_lines(node)} lines)"
        for path in production_sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and body_lines(node) > MAX_FUNCTION_LINES
    ]
    assert not too_long, f"over {MAX_FUNCTION_LINES} lines: {too_long}"


# Algorithm packages: DiLoCo, SparseLoCo, and an example written as a third party would.
ALGORITHMS = [
    ROOT / "plugins" / "pcp-diloco" / "pcp_diloco",
    ROOT / "plugins" / "pcp-sparseloco" / "pcp_sparseloco",
    ROOT / "examples" / "pcp-fedavg" / "pcp_fedavg",
]
# The core modules an algorithm plugin imports: `hookimpl`, what registers it and
# declares its settings (light: imported when `pcp --help` lists the plugins), and the
# engine for all the rest, so the core may move its parts without breaking the plugin;
# one that brings its own codec, the codec contract too (as a codec plugin does).
ALGORITHM_IMPORTS = {"pcp_core", "pcp_core.algorithms", "pcp_core.settings", "pcp_core.engine"}
CODEC_CONTRACT = "pcp_core.codecs"


@pytest.mark.parametrize("package", ALGORITHMS, ids=lambda package: package.name)
def test_algorithms_import_the_core_through_the_engine(package: Path) -> None:
    used = {
        target
        for path in package.glob("*.py")
        for target, _ in imports(f"{package.name}.{path.stem}", path)
    }
    brings_a_codec = "pcp_register_codecs" in (package / "__init__.py").read_text()
    allowed = ALGORITHM_IMPORTS | ({CODEC_CONTRACT} if brings_a_codec else set())
    assert used <= allowed, f"import from pcp_core.engine: {used - allowed}"


def source(package: Path, name: str) -> Path | None:
    """The file of the package's module `name`, or None (a name inside a module)."""
    path = package.parent.joinpath(*name.split("."))
    return next((p for p in (path / "__init__.py", path.with_suffix(".py")) if p.is_file()), None)


@pytest.mark.parametrize("package", ALGORITHMS, ids=lambda package: package.name)
def test_algorithms_are_discovered_without_the_engine(package: Path) -> None:
    """What `pcp --help` imports of the plugin (its package, and what that imports at
    its top level) imports the engine only inside functions: discovery stays fast."""
    seen, todo = {package.name}, [package.name]
    while todo:
        path = source(package, todo.pop())
        assert path is not None
        for node in ast.parse(path.read_text()).body:  # the top level: what runs at import
            if isinstance(node, ast.Import):
                names = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            else:
                continue
            assert "pcp_core.engine" not in names, f"{path.name} imports the engine at the top"
            mine = {n for n in names - seen if n.startswith(package.name) and source(package, n)}
            todo += sorted(mine)
            seen |= mine
