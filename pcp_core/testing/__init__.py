"""Test kit for plugin authors: installing throwaway plugins, conformance suites."""

from pathlib import Path


def install_fake_plugin(
    site: Path, distribution: str, module: str, source: str, version: str = "1.0"
) -> None:
    """Make `distribution` importable from `site` with an entry point in group `pcp`.

    A real installation as far as `importlib.metadata` is concerned: a module plus a
    `.dist-info` directory. Put `site` on PYTHONPATH of the process under test.
    """
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(source, encoding="utf-8")
    info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(f"[pcp]\n{module} = {module}\n", encoding="utf-8")
