"""requirements-worker.txt: an IREE worker's run-time needs, as the packages declare them,
without jax, jaxlib, optax or the IREE compiler (nox -s worker-iree-cpu installs and runs it)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER_PLUGINS = ["pcp-cpu", "pcp-nesterov", "pcp-capnp-tcp", "pcp-diloco", "pcp-codecs"]
LEFT_OUT = {"jax", "jaxlib", "optax", "iree-base-compiler"}


def name(requirement: str) -> str:
    for separator in "=<>!~[; ":
        requirement = requirement.split(separator)[0]
    return requirement.strip().lower()


def dependencies(path: Path) -> list[str]:
    return tomllib.loads((path / "pyproject.toml").read_text())["project"]["dependencies"]


def test_the_worker_list_is_the_packages_own_minus_jax_and_the_compiler() -> None:
    lines = (ROOT / "requirements-worker.txt").read_text().splitlines()
    listed = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    declared = dependencies(ROOT) + [
        r for plugin in WORKER_PLUGINS for r in dependencies(ROOT / "plugins" / plugin)
    ]
    third_party = {r for r in declared if not name(r).startswith("pcp-")}
    assert set(listed) <= third_party, set(listed) - third_party  # as declared, pins included
    assert not {name(r) for r in listed} & LEFT_OUT
    # what the worker plugins need is all there (matplotlib draws plots on the shepherd,
    # cryptography derives workers' credentials there)
    shepherds = {"matplotlib", "cryptography"}
    needed = {r for r in third_party if name(r) not in LEFT_OUT | shepherds}
    assert needed <= set(listed), needed - set(listed)
