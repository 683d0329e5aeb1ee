"""Test kit for plugin authors: the conformance suites and throwaway plugin installs.

Every kind of plugin has a suite to subclass with its name (three lines, see
docs/plugins.md); `pcp_core.testing.pytest_plugin` is loaded by pytest on its own.
"""

from importlib import import_module
from pathlib import Path
from typing import Any

SUITES = {
    "AggregatorConformance": "aggregator_suite",
    "AlgorithmConformance": "algorithm_suite",
    "BackendConformance": "backend_suite",
    "CodecConformance": "codec_suite",
    "DatasetConformance": "dataset_suite",
    "InnerOptimizerConformance": "optimizer_suite",
    "LauncherConformance": "launcher_suite",
    "ModelConformance": "model_suite",
    "OuterOptimizerConformance": "optimizer_suite",
    "TransportConformance": "transport_suite",
}

__all__ = [*SUITES, "install_fake_plugin"]


def __getattr__(name: str) -> Any:
    """The suites import pytest and numpy: loaded only when a test asks for one."""
    if name in SUITES:
        return getattr(import_module(f"pcp_core.testing.{SUITES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
