"""Test sessions. `nox` runs the default ones (lint + tests); the rest by name:

nox -s slow          # slow end-to-end tests (multi-GiB payloads, long runs)
nox -s plugin        # each plugin alone on top of the core: the install matrix
nox -s dist          # wheels and sdists of every package into dist/, checked
nox -s install       # from dist/ into a fresh environment: the commands users type
"""

import shutil
import tomllib
import zipfile
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

# Every package here but the core: the plugins and the example third-party plugin.
PACKAGES = {
    p.parent.name: p.parent
    for folder in ("plugins", "examples")
    for p in sorted(Path(folder).glob("*/pyproject.toml"))
}
DIST = Path("dist")


def project(path: Path) -> dict:
    return tomllib.loads((path / "pyproject.toml").read_text())["project"]


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


def local_requirements(name: str) -> list[str]:
    """The packages of this repository `name` depends on, recursively, as -e arguments."""
    names = [d.split("=")[0].strip() for d in project(PACKAGES[name]).get("dependencies", [])]
    found = [n for n in names if n in PACKAGES]
    return [arg for n in found for arg in (*local_requirements(n), "-e", str(PACKAGES[n]))]


def core_with_standard_plugins() -> list[str]:
    """pcp-core and the plugins it depends on, from this checkout, as install arguments."""
    standard = [d.split("=")[0] for d in project(Path("."))["dependencies"] if d.startswith("pcp-")]
    return ["-e", ".[test]", *(arg for name in standard for arg in ("-e", str(PACKAGES[name])))]


@nox.session(python="3.11")
@nox.parametrize("plugin", list(PACKAGES))
def plugin(session: nox.Session, plugin: str) -> None:
    """One plugin with the core (and the standard plugins it brings) and what it declares."""
    session.install(*core_with_standard_plugins())
    session.install(*local_requirements(plugin), "-e", str(PACKAGES[plugin]))
    session.run("pytest", "-q", str(PACKAGES[plugin]), env={"PCP_STRICT_PLUGINS": "1"})


@nox.session(python="3.11")
def dist(session: nox.Session) -> None:
    """A wheel and an sdist of every package, their metadata checked, and each wheel
    checked to hold its package and its entry points."""
    shutil.rmtree(DIST, ignore_errors=True)
    session.install("build", "twine")
    for path in [Path("."), *PACKAGES.values()]:
        session.run("python", "-m", "build", "--outdir", str(DIST), str(path), silent=True)
    session.run("twine", "check", "--strict", *map(str, sorted(DIST.iterdir())))
    for path in [Path("."), *PACKAGES.values()]:
        meta = project(path)
        wheel_name = f"{meta['name'].replace('-', '_')}-{meta['version']}-py3-none-any.whl"
        with zipfile.ZipFile(DIST / wheel_name) as wheel:
            names = wheel.namelist()
            info = f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
            entry_points = wheel.read(f"{info}/entry_points.txt").decode()
        module = meta["name"].replace("-", "_")
        if not any(n.startswith(f"{module}/") for n in names):
            session.error(f"{wheel_name} holds no {module}/ package")
        for key in meta.get("entry-points", {}).get("pcp", {}):
            if f"{key} = " not in entry_points:
                session.error(f"{wheel_name} lacks its pcp entry point {key!r}")


@nox.session(python="3.11")
def install(session: nox.Session) -> None:
    """What a user types, from dist/ (run `nox -s dist` first) in a fresh environment."""
    if not DIST.is_dir():
        session.error("no dist/: run `nox -s dist` first")
    session.install("--find-links", str(DIST), "pcp-core", "pcp-iree-rocm")
    session.chdir(session.create_tmp())
    session.run("pcp", "plugins")
    session.run("pcp", "compile", "--backend", "rocm", "-o", "train.vmfb")
    # No ROCm here: one line that says what to install, a non-zero exit, no worker started.
    output = session.run(
        "pcp", "train", "--algorithm", "diloco", "--backend", "rocm",
        success_codes=[2], silent=True,
    )  # fmt: skip
    if "install ROCm" not in output or "Traceback" in output:
        session.error(f"expected the one-line missing-device error, got:\n{output}")
    session.run(
        "pcp", "train", "--algorithm", "diloco", "--backend", "cpu", "--workers", "2",
        "--steps", "100", "--inner-steps", "50", "--out", "diloco-run",
    )  # fmt: skip
