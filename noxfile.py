"""Every test of the repository, as nox sessions: `nox` runs them all (what CI runs).

nox -l                   # every session, the combination matrix included
nox -t cpu               # one slice: the CPU environment and its combinations (or vulkan,
                         #   cuda, rocm, metal, xla, matrix, plugins, authoring, install)
nox -s lint tests        # ruff and the core's tests, slow ones included
nox -s typecheck         # mypy over the core and every plugin's package (nox -t lint: and ruff)
nox -s tests -- tests    # the core's quick tests only, for iterating
nox -s "plugin(pcp-adamw)"

- lint, tests: ruff; the core's tests (`tests/`, slow ones included), with every package
  installed editable.
- typecheck: mypy over pcp_core and every plugin's package, their tests left out
  (settings: pyproject.toml's [tool.mypy]), against the development set's libraries.
- plugin(NAME): one package with only what its pyproject declares (dependencies and its
  `test` extra) on top of pcp-core without its standard plugins, all its tests, slow ones
  included: a dependency missing from a pyproject fails here.
- env-BACKEND, matrix-BACKEND-...: one environment per backend, installed from the
  packages (never the source tree on sys.path), then one session per combination of
  algorithm x inner optimizer x outer optimizer x transport: compile for the backend,
  then train where the device exists; elsewhere the session is reported as skipped,
  with the reason. CPU, Vulkan (lavapipe) and XLA (on the CPU jaxlib) must train under CI.
- worker-iree-cpu: an IREE worker installed without jax or the IREE compiler
  (requirements-worker.txt) trains for a shepherd from env-cpu.
- scaffold: `pcp plugin new` for every kind; each package installs and passes its tests.
- dist, install: wheels and sdists checked; from dist/ with pip, the commands users type.
- container-cpu: PCP's image built from dist/ with podman, offline; `pcp train` and a
  shepherd with two workers, each in a container (root, podman, runc and debootstrap).
"""

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from pathlib import Path

import nox

# One OpenBLAS thread in every session, as `pcp` sets for itself (pcp_core/cli/__init__.py):
# the tests that run a shepherd or workers inside pytest spin its idle threads otherwise.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Bytecode written where it is missing. uv installs a session's packages without .pyc, and
# where the environment sets PYTHONDONTWRITEBYTECODE (CI's image does) every `pcp` process
# a test starts compiled jax and the rest from source: `import jax` 4.2 CPU-s against 1.6.
# Three subprocess-heavy test files in the tests session's venv: 114 s and 211 CPU-s
# without, 56 s and 106 CPU-s with. __pycache__ is git-ignored and in no wheel or sdist.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).parent
PYTHON = "3.11"
# Every package here but the core: the plugins and the example third-party plugin.
PACKAGES = {
    p.parent.name: p.parent
    for folder in ("plugins", "examples")
    for p in sorted((ROOT / folder).glob("*/pyproject.toml"))
}
DIST = ROOT / "dist"
# One compile cache for every session that compiles: entries are keyed by program, target,
# flags and compiler version, so a session reuses another's only where it would compile
# the same bytes; the tests of the cache itself point PCP_CACHE_DIR elsewhere.
CACHE = ROOT / ".nox" / "pcp-cache"
# Workers for the test suites (pytest-xdist): each test's `pcp` processes are themselves
# multi-threaded, so more than a few workers only contend; `auto` is one per core.
XDIST = ["-n", "auto", "--maxprocesses", "4"]
# Tests with timeouts of seconds (`serial`): two at a time kept them passing here (2 cores)
# in half the time of one at a time. Work stealing: the two outage tests (minutes each) sit
# side by side in the order, and a worker idle at the end takes the second (diloco's serial
# phase: 528 s in CI without it, 467 s by hand with it; not measured side by side).
PAIRS = ["-n", "2", "--dist", "worksteal"]
# The tag of sessions whose tests fill every core by themselves (xdist): scripts/nox_lanes.py
# runs them alone and the others side by side.
FILLS_CORES = "fills-cores"

# What the repository provides, by kind; env-* checks the installed plugins agree.
BACKENDS = {
    "cpu": "pcp-cpu",
    "vulkan": "pcp-iree-vulkan",
    "cuda": "pcp-iree-cuda",
    "rocm": "pcp-iree-rocm",
    "metal": "pcp-iree-metal",
    "xla": "pcp-xla",
}
TRAINS_IN_CI = {"cpu", "vulkan", "xla"}  # lavapipe runs Vulkan on CI's CPU; xla on its jaxlib
ALGORITHMS = {"local": False, "diloco": True}  # name -> distributed (outer step, transport)
INNER = ["adamw", "lion"]
# The example plugins in the matrix: pcp-lion's optimizer combines with every algorithm;
# pcp-fedavg's algorithm is tested alone (nox -t plugins), as a third party's would be.
MATRIX_EXAMPLES = ["pcp-lion"]
OUTER = ["nesterov"]
TRANSPORTS = ["capnp-tcp"]
# Small enough for lavapipe (~100 tokens/s) yet a falling loss: 20 steps of 4 x 16 tokens.
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16"]
SHORT = ["--batch-size", "4", "--steps", "20", "--steps-per-call", "10", "--warmup-steps", "5"]


def _pip_find_links() -> str:
    """pip's find-links on this machine (local wheels such as a CPU torch), for uv too."""
    found = os.environ.get("PIP_FIND_LINKS", "")
    if not found:
        query = [sys.executable, "-m", "pip", "config", "get", "global.find-links"]
        done = subprocess.run(query, capture_output=True, text=True)
        found = done.stdout.strip() if done.returncode == 0 else ""
    return found


if _pip_find_links() and "UV_FIND_LINKS" not in os.environ:
    os.environ["UV_FIND_LINKS"] = _pip_find_links()


def compile_cache() -> str:
    """CACHE for PCP_CACHE_DIR, made private (0700) as pcp would make it: a test that
    checks the cache it is given may run before anything has compiled."""
    CACHE.mkdir(mode=0o700, parents=True, exist_ok=True)
    return str(CACHE)


def project(path: Path) -> dict:
    return tomllib.loads((path / "pyproject.toml").read_text())["project"]


def requirement_name(requirement: str) -> str:
    for separator in "=<>!~[; ":
        requirement = requirement.split(separator)[0]
    return requirement.strip()


def declared(name: str, extras: bool) -> list[str]:
    meta = project(PACKAGES[name])
    test = meta.get("optional-dependencies", {}).get("test", []) if extras else []
    return [*meta.get("dependencies", []), *test]


def closure(name: str) -> tuple[list[Path], list[str]]:
    """What installing `name` with its test extra brings: repository packages (its own
    included) and third-party requirements, without the plugins pcp-core depends on."""
    local: list[Path] = []
    third_party = [r for r in project(ROOT)["dependencies"] if requirement_name(r) not in PACKAGES]
    pending, seen = [(name, True)], set()
    while pending:
        current, extras = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        local.append(PACKAGES[current])
        for requirement in declared(current, extras):
            dependency = requirement_name(requirement)
            if dependency in PACKAGES:
                pending.append((dependency, False))
            elif dependency != "pcp-core":
                third_party.append(requirement)
    return local, third_party


def standard_plugins() -> list[str]:
    names = [requirement_name(r) for r in project(ROOT)["dependencies"]]
    return [str(PACKAGES[n]) for n in names if n in PACKAGES]


@nox.session(python=PYTHON, tags=["lint"])
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def typed_packages() -> list[str]:
    """What mypy checks: pcp_core and each package's own (plugins/*/pcp_*, examples/*/pcp_*,
    no egg-info), not their tests."""
    found = [p for path in PACKAGES.values() for p in sorted(path.glob("pcp_*"))]
    return ["pcp_core", *(str(p.relative_to(ROOT)) for p in found if p.suffix != ".egg-info")]


# First tag its own: scripts/nox_lanes.py runs it beside another unit, not after ruff.
@nox.session(python=PYTHON, tags=["typecheck", "lint"])
def typecheck(session: nox.Session) -> None:
    """mypy, with the libraries the code imports installed (the development set, as
    `tests` installs it, and pcp-mlflow's): their own types are checked against."""
    session.install("mypy", "-r", "requirements-dev.txt", "-e", str(PACKAGES["pcp-mlflow"]))
    session.run("mypy", *typed_packages())


@nox.session(python=PYTHON, tags=["tests", FILLS_CORES])
def tests(session: nox.Session) -> None:
    """The core's tests, slow ones included; `nox -s tests -- ARGS` passes ARGS to pytest
    instead (`nox -s tests -- tests`: the quick ones)."""
    session.install("-r", "requirements-dev.txt")
    pytest = ["python", "-m", "pytest", "-q"]
    env = {"PCP_CACHE_DIR": compile_cache()}
    if session.posargs:
        session.run(*pytest, *session.posargs, env=env)
        return
    in_phases(session, [*pytest, "tests"], env)


def runs_on_xdist(name: str) -> bool:
    """Whether the package's tests declare pytest-xdist: `plugin(NAME)` runs them then in
    phases, most on every core (`in_phases`)."""
    return "pytest-xdist" in map(requirement_name, declared(name, extras=True))


@nox.session(python=PYTHON, reuse_venv=False)  # nothing left from before
@nox.parametrize(
    "plugin",
    [
        nox.param(name, id=name, tags=["plugins", *([FILLS_CORES] * runs_on_xdist(name))])
        for name in PACKAGES
    ],
)
def plugin(session: nox.Session, plugin: str) -> None:
    """One package on pcp-core alone plus what it declares; all its tests, slow included."""
    local, third_party = closure(plugin)
    session.install("--no-deps", str(ROOT), *map(str, local))
    session.install(*third_party)
    pytest = ["pytest", "-q", "-p", "no:cacheprovider", str(PACKAGES[plugin])]
    env = {"PCP_STRICT_PLUGINS": "1", "PCP_CACHE_DIR": compile_cache()}
    if not runs_on_xdist(plugin):
        session.run(*pytest, "-m", "slow or not slow", env=env)
        return
    in_phases(session, pytest, env)  # its tests declare pytest-xdist


def in_phases(session: nox.Session, pytest: list[str], env: dict[str, str]) -> None:
    """All the tests, slow ones included, in three runs: most in parallel on every core;
    then those marked `serial` (timeouts of seconds, which a busy machine would trip) two
    at a time; then those marked `alone` (they measure time shares or fill the machine)
    one at a time. A run that selects no test (pytest's exit code 5) is no failure."""
    session.run(*pytest, *XDIST, "-m", "(slow or not slow) and not serial and not alone", env=env)
    session.run(*pytest, *PAIRS, "-m", "serial and not alone", env=env, success_codes=[0, 5])
    session.run(*pytest, "-m", "alone", env=env, success_codes=[0, 5])


def pcp_json(session: nox.Session, bin_dir: Path, *args: str) -> list[dict]:
    """`pcp ARGS --json`, strict: a plugin that fails to load fails the session (and
    nox shows why); without a failure the output is the JSON alone."""
    output = session.run(
        str(bin_dir / "pcp"), *args, "--json",
        external=True, silent=True, env={"PCP_STRICT_PLUGINS": "1"},
    )  # fmt: skip
    return json.loads(output)


def make_environment(backend: str) -> None:
    @nox.session(name=f"env-{backend}", python=PYTHON, tags=[backend, "matrix"])
    def environment(session: nox.Session) -> None:
        """pcp-core, the standard plugins, the example plugin and this backend's plugin,
        installed as packages; checks the matrix covers everything they register."""
        examples = [str(PACKAGES[name]) for name in MATRIX_EXAMPLES]
        backend_plugin = str(PACKAGES[BACKENDS[backend]])
        plugins = dict.fromkeys([*standard_plugins(), *examples, backend_plugin])  # in order, once
        session.install(str(ROOT), *plugins)
        session.chdir(tempfile.mkdtemp())  # nothing of the checkout on sys.path
        where = session.run(
            "python", "-c", "import pcp_core; print(pcp_core.__file__)", silent=True
        )
        if "site-packages" not in where:
            session.error(f"pcp_core comes from {where.strip()}, not an installed package")
        registered = {
            tuple(item)
            for record in pcp_json(session, Path(session.bin), "plugins")
            for item in record["registered"]
        }
        expected = {("backend", "cpu"), ("backend", backend)}  # pcp-core brings pcp-cpu
        expected |= {("algorithm", a) for a in ALGORITHMS}
        expected |= {("optimizer", o) for o in INNER + OUTER}
        expected |= {("transport", t) for t in TRANSPORTS}
        kinds = {"backend", "algorithm", "optimizer", "transport"}
        found = {item for item in registered if item[0] in kinds}
        if found != expected:
            session.error(f"the matrix covers {sorted(expected)}, installed: {sorted(found)}")


def combinations() -> list[tuple[str, str, str | None, str | None]]:
    rows = []
    for algorithm, distributed in ALGORITHMS.items():
        for inner in INNER:
            if not distributed:
                rows.append((algorithm, inner, None, None))
            for outer in OUTER if distributed else []:
                rows += [(algorithm, inner, outer, transport) for transport in TRANSPORTS]
    return rows


def require_trained(session: nox.Session, run_dir: Path, what: str) -> None:
    """Fail the session unless the run in `run_dir` learnt: a finite final loss below
    the corpus's unigram entropy plus a margin."""
    summary = json.loads((run_dir / "summary.json").read_text())
    loss = summary["final_train_loss"]
    if not (math.isfinite(loss) and loss < summary["unigram_entropy"] + 0.5):
        session.error(f"{what} did not train: final loss {loss}")


def make_combination(backend: str, combination: tuple) -> None:
    algorithm, inner, outer, transport = combination
    name = "-".join(["matrix", backend, *(part for part in combination if part)])

    @nox.session(
        name=name, venv_backend="none", requires=[f"env-{backend}"], tags=[backend, "matrix"]
    )
    def run(session: nox.Session) -> None:
        """Compile this combination for the backend; train it where the device exists."""
        bin_dir = ROOT / ".nox" / f"env-{backend}" / "bin"
        path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
        env = {"PATH": path, "PCP_CACHE_DIR": compile_cache()}
        session.chdir(tempfile.mkdtemp())
        chosen = ["--backend", backend, "--algorithm", algorithm, "--optimizer", inner]
        if outer:
            chosen += ["--outer-optimizer", outer, "--transport", transport]
        shape = [*TINY, *SHORT, "--eval-batches", "2"]
        pcp = str(bin_dir / "pcp")
        session.run(pcp, "compile", *chosen, *shape, "-o", "train.vmfb", env=env, external=True)
        device = next(r for r in pcp_json(session, bin_dir, "devices") if r["backend"] == backend)
        if not device["available"]:
            reason = f"no {backend} device here ({device['note'] or 'driver missing'})"
            if backend in TRAINS_IN_CI and os.environ.get("CI"):
                session.error(f"{reason}: CI must train on {backend}")
            session.skip(f"compiled; not trained: {reason}")
        extra = ["--workers", "2", "--inner-steps", "10"] if outer else []
        session.run(pcp, "train", *chosen, *shape, *extra, "--out", "run", env=env, external=True)
        require_trained(session, Path("run"), name)


for _backend in BACKENDS:
    make_environment(_backend)
    for _combination in combinations():
        make_combination(_backend, _combination)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@nox.session(name="worker-iree-cpu", python=PYTHON, requires=["env-cpu"], tags=["cpu", "matrix"])
def worker_iree_cpu(session: nox.Session) -> None:
    """An IREE worker installed as the README says, without jax or the IREE compiler
    (requirements-worker.txt), trains a DiLoCo run for a shepherd from env-cpu."""
    plugins = ("pcp-cpu", "pcp-nesterov", "pcp-capnp-tcp", "pcp-diloco", "pcp-codecs")
    worker = [str(PACKAGES[n]) for n in plugins]
    session.install("--no-deps", str(ROOT), *worker)
    session.install("-r", str(ROOT / "requirements-worker.txt"))
    session.chdir(tempfile.mkdtemp())
    found = session.run(
        "python", "-c",
        "import importlib.util as u; print(*[m for m in ('jax', 'jaxlib', 'optax', "
        "'iree.compiler') if u.find_spec(m)])",
        silent=True,
    ).strip()  # fmt: skip
    if found:
        session.error(f"the worker's environment has {found}")
    session.run("pcp", "worker", "--help", silent=True)
    port = free_port()
    shepherd_bin = ROOT / ".nox" / "env-cpu" / "bin"
    command = [str(shepherd_bin / "pcp"), "shepherd", "--port", str(port), "--workers", "1"]
    command += [*TINY, *SHORT, "--inner-steps", "10", "--eval-batches", "2", "--out", "run"]
    env = os.environ | {
        "PCP_CACHE_DIR": compile_cache(),
        "PATH": f"{shepherd_bin}:{os.environ['PATH']}",
    }
    with open("shepherd.log", "wb") as log:
        shepherd = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(600):  # the secret it writes for loopback workers
            if Path("run/token").exists() or shepherd.poll() is not None:
                break
            time.sleep(0.1)
        session.run(
            "pcp", "worker", "--connect", f"127.0.0.1:{port}", "--backend", "cpu",
            "--token-file", "run/token", "--restarts", "0", env={"PCP_STRICT_PLUGINS": "1"},
        )  # fmt: skip
        code = shepherd.wait(300)
    finally:
        if shepherd.poll() is None:
            shepherd.kill()
    if code != 0:
        session.error(f"the shepherd failed ({code}): {Path('shepherd.log').read_text()[-3000:]}")
    require_trained(session, Path("run"), "the jax-free worker's run")


@nox.session(python=PYTHON, tags=["authoring"])
def scaffold(session: nox.Session) -> None:
    """`pcp plugin new` of every kind, installed with pcp-core, each passing its tests."""
    session.install(str(ROOT), *standard_plugins())
    kinds = session.run(
        "python", "-c", "from pcp_core.cli.scaffold import KINDS; print(*KINDS)", silent=True
    ).split()
    workspace = Path(tempfile.mkdtemp())
    session.chdir(workspace)
    for kind in kinds:
        session.run("pcp", "plugin", "new", f"my-{kind}", "--kind", kind)
    packages = [f"./pcp-my-{kind}[test]" for kind in kinds]
    session.install(str(ROOT), *standard_plugins(), *packages)
    env = {"PCP_CACHE_DIR": compile_cache()}
    for kind in kinds:
        session.chdir(workspace / f"pcp-my-{kind}")
        session.run("pytest", "-q", "-p", "no:cacheprovider", env=env)


@nox.session(python=PYTHON, tags=["install"])
def dist(session: nox.Session) -> None:
    """A wheel and an sdist of every package, their metadata checked, and each wheel
    checked to hold its package and its entry points."""
    shutil.rmtree(DIST, ignore_errors=True)
    session.install("build[uv]", "twine")
    for path in [ROOT, *PACKAGES.values()]:
        # uv sets up each isolated build environment in a second, where pip takes ten
        build = ["python", "-m", "build", "--installer", "uv", "--outdir", str(DIST), str(path)]
        session.run(*build, silent=True)
    session.run("twine", "check", "--strict", *map(str, sorted(DIST.iterdir())))
    for path in [ROOT, *PACKAGES.values()]:
        check_wheel(session, path)


def check_wheel(session: nox.Session, path: Path) -> None:
    meta = project(path)
    stem = f"{meta['name'].replace('-', '_')}-{meta['version']}"
    with zipfile.ZipFile(DIST / f"{stem}-py3-none-any.whl") as wheel:
        names = wheel.namelist()
        entry_points = wheel.read(f"{stem}.dist-info/entry_points.txt").decode()
    module = meta["name"].replace("-", "_")
    if not any(n.startswith(f"{module}/") for n in names):
        session.error(f"{stem} holds no {module}/ package")
    for key in meta.get("entry-points", {}).get("pcp", {}):
        if f"{key} = " not in entry_points:
            session.error(f"{stem} lacks its pcp entry point {key!r}")


@nox.session(python=PYTHON, venv_backend="virtualenv", requires=["dist"], tags=["install"])
def install(session: nox.Session) -> None:
    """What a user types, with pip, from dist/ into a fresh environment."""
    session.install("--find-links", str(DIST), "pcp-core", "pcp-iree-rocm", "pcp-tensorboard")
    session.chdir(tempfile.mkdtemp())
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
    if not list(Path("diloco-run/tensorboard").glob("events.out.tfevents.*")):
        session.error("pcp-tensorboard is installed, but the run wrote no TensorBoard events")


# What runs containers on CI's machines (Firecracker VMs with cgroup v1): runc (crun
# refuses hybrid cgroups), cgroupfs, and rlimits both runtimes accept (docs/launchers.md).
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""
CONTAINER_BASE = "localhost/pcp-ci-base"  # Debian bookworm's python3, by debootstrap
CONTAINER_IMAGE = "localhost/pcp-ci:cpu"


class Podman:
    """podman, configured by CONTAINERS_CONF, for a nox session."""

    def __init__(self, session: nox.Session, folder: Path) -> None:
        (folder / "containers.conf").write_text(CONTAINERS_CONF)
        self.session, self.env = session, {"CONTAINERS_CONF": str(folder / "containers.conf")}

    def __call__(self, *args: str) -> str:
        return self.session.run("podman", *args, external=True, env=self.env, silent=True)

    def quietly(self, *args: str) -> int:
        """Run podman without failing the session; its exit status."""
        command = ["podman", *args]
        return subprocess.run(command, env=os.environ | self.env, capture_output=True).returncode


@nox.session(
    name="container-cpu", python=PYTHON, venv_backend="virtualenv", requires=["dist"],
    tags=["install"],
)  # fmt: skip
def container_cpu(session: nox.Session) -> None:
    """PCP's CPU image, built by containers/build.sh from dist/ with no network (a
    debootstrapped Debian base, the dependencies downloaded here), runs `pcp train`, then
    a shepherd and two worker containers on a podman network, the token a podman secret."""
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        reason = f"not on PATH: {', '.join(missing)}" if missing else "needs root"
        if os.environ.get("CI"):
            session.error(f"containers cannot run in CI: {reason}")
        session.skip(reason)
    work = Path(tempfile.mkdtemp())
    podman = Podman(session, work)
    if podman.quietly("image", "exists", CONTAINER_BASE) != 0:
        root = work / "root"
        bootstrap = ["--variant=minbase", "--include=python3,python3-venv", "bookworm", str(root)]
        session.run("debootstrap", *bootstrap, silent=True, external=True)
        imported = f"tar -C {root} -c . | podman import - {CONTAINER_BASE}"
        session.run("bash", "-c", imported, external=True, env=podman.env, silent=True)
        shutil.rmtree(root)
    wheels = work / "wheels"  # PCP's from dist/, the rest as pip resolves them here
    session.run("pip", "download", "-q", "--find-links", str(DIST), "-d", str(wheels), "pcp-core")
    offline = {"BASE": CONTAINER_BASE, "WHEELS": str(wheels), "PIP_ARGS": "--no-index"}
    offline |= {"ENGINE": "podman", "ENGINE_ARGS": "--network none", **podman.env}
    build = ["bash", str(ROOT / "containers" / "build.sh"), "cpu", CONTAINER_IMAGE]
    session.run(*build, external=True, env=offline, silent=True)
    out = work / "out"
    out.mkdir()
    podman("run", "--rm", "-v", f"{out}:/work/out", CONTAINER_IMAGE,
           "train", *TINY, *SHORT, "--out", "/work/out/train")  # fmt: skip
    require_trained(session, out / "train", "pcp train in a container")
    run_on_a_container_network(session, podman, work, out)


def run_on_a_container_network(session: nox.Session, podman: Podman, work: Path, out: Path) -> None:
    """A shepherd and two workers, each a container, on a podman network of their own
    (by IP address: podman's CNI backend here resolves no names); the token reaches
    each as a podman secret, a 0400 file."""
    name = f"pcp-ci-{os.getpid()}"
    containers = [f"{name}-{who}" for who in ("shepherd", "worker-0", "worker-1")]
    secret = os.urandom(32).hex()
    (work / "token").write_text(secret)
    token_file = ["--token-file", f"/run/secrets/{name}"]
    try:
        podman("network", "create", name)
        podman("secret", "create", name, str(work / "token"))
        joined = ["--network", name, "--secret", f"{name},mode=0400"]
        settings = [*TINY, *SHORT, "--inner-steps", "10", "--no-dashboard"]
        podman("run", "-d", "--name", containers[0], *joined, "-v", f"{out}:/work/out",
               CONTAINER_IMAGE, "shepherd", "--host", "0.0.0.0", "--workers", "2",
               *token_file, "--out", "/work/out/run", *settings)  # fmt: skip
        address = podman("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}"
                         "{{end}}", containers[0]).strip()  # fmt: skip
        for worker in containers[1:]:
            podman("run", "-d", "--name", worker, *joined, CONTAINER_IMAGE, "worker",
                   "--connect", f"{address}:7433", "--backend", "cpu", *token_file)  # fmt: skip
        status = podman("wait", containers[0]).strip()
        seen = [podman("logs", container) for container in containers]
        seen.append(podman("inspect", *containers))
    finally:
        for container in containers:
            podman.quietly("rm", "-f", container)
        podman.quietly("network", "rm", name)
        podman.quietly("secret", "rm", name)
    if status != "0":
        session.error(f"the shepherd's container exited with {status}:\n{seen[0][-3000:]}")
    require_trained(session, out / "run", "the run of containers")
    if any(secret in text for text in seen):
        session.error("the secret shows in a container's logs or its configuration")
