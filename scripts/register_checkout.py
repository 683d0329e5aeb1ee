"""Make this checkout's packages importable, entry points included, without pip.

For machines that can neither build nor fetch packages (the GPU box of the device
tool): writes a `.dist-info` for pcp-core and each plugin into SITE and prints the
PYTHONPATH that holds SITE and their source folders. Dependencies are not checked.

    export PYTHONPATH=$(python scripts/register_checkout.py SITE)
"""

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def register(package: Path, site: Path) -> str:
    project = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, entry_points in project.get("entry-points", {}).items():
        lines += [f"[{group}]", *(f"{key} = {value}" for key, value in entry_points.items())]
    if project.get("scripts"):
        lines += ["[console_scripts]", *(f"{k} = {v}" for k, v in project["scripts"].items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return str(package)


def main() -> None:
    site = Path(sys.argv[1])
    packages = [ROOT, *sorted(p.parent for p in ROOT.glob("[pe]*/*/pyproject.toml"))]
    paths = [str(site), *(register(p, site) for p in packages)]
    print(":".join(paths))


if __name__ == "__main__":
    main()
