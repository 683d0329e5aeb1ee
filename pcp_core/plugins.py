"""Discovering plugins through entry points and collecting what they register.

A broken plugin never crashes the host: its error is recorded and shown by
`pcp plugins`. `PCP_STRICT_PLUGINS=1` turns any recorded error into a failure
(for CI). `PCP_PLUGINS=a,b` loads only the named distributions and
`PCP_DISABLE_PLUGINS=a,b` skips some; the core's built-ins always load.
"""

import os
import traceback
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy
import structlog

from pcp_core import PLUGIN_API, __version__, builtin, hookspecs
from pcp_core.registry import Registry

if TYPE_CHECKING:  # types only: plugin discovery must not import what it finds
    from pcp_core.aggregators import Aggregator
    from pcp_core.algorithms import Algorithm
    from pcp_core.backends import Backend
    from pcp_core.codecs import Codec
    from pcp_core.data.text import DatasetSource
    from pcp_core.launchers import Launcher
    from pcp_core.models import Model
    from pcp_core.optimizers import InnerOptimizer, OuterOptimizer
    from pcp_core.watch.metrics import MetricSink
    from pcp_core.wire.transport import Transport

log = structlog.get_logger(__name__)

ENTRY_POINT_GROUP = "pcp"
CORE_DISTRIBUTION = "pcp-core"

# registry kind -> the hook that fills it
REGISTRY_HOOKS: dict[str, str] = {
    "backend": "pcp_register_backends",
    "optimizer": "pcp_register_optimizers",
    "transport": "pcp_register_transports",
    "codec": "pcp_register_codecs",
    "aggregator": "pcp_register_aggregators",
    "algorithm": "pcp_register_algorithms",
    "model": "pcp_register_models",
    "dataset": "pcp_register_datasets",
    "metric_sink": "pcp_register_metric_sinks",
    "launcher": "pcp_register_launchers",
}


class PluginLoadError(RuntimeError):
    """Raised in strict mode when any plugin failed to load or register."""


@dataclass
class PluginRecord:
    """One distribution's plugin as the user sees it in `pcp plugins`."""

    distribution: str
    version: str
    registered: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _env_set(name: str) -> set[str]:
    return {item.strip() for item in os.environ.get(name, "").split(",") if item.strip()}


def _normalise(distribution: str) -> str:
    return distribution.lower().replace("_", "-")


def strict_mode() -> bool:
    return os.environ.get("PCP_STRICT_PLUGINS", "") not in ("", "0", "false", "no")


def api_mismatch(module: Any) -> str | None:
    """Why `module` cannot be loaded by this core's plugin API, or None if it can."""
    declared = getattr(module, "PCP_PLUGIN_API", None)
    if declared is None:
        return (
            f"not loaded: {module.__name__} declares no PCP_PLUGIN_API "
            f"(this pcp-core speaks plugin API {PLUGIN_API})"
        )
    if declared != PLUGIN_API:
        return (
            f"not loaded: written for plugin API {declared!r}, "
            f"this pcp-core speaks plugin API {PLUGIN_API}"
        )
    return None


def _short_error(error: BaseException) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1:] if error.__traceback__ else []
    where = f" ({frame[0].filename}:{frame[0].lineno})" if frame else ""
    return f"{type(error).__name__}: {error}{where}"


class PluginHost:
    """The plugin manager plus one registry per kind, filled at load time."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self.registries: dict[str, Registry[Any]] = {
            kind: Registry(kind) for kind in REGISTRY_HOOKS
        }

    # -- loading --------------------------------------------------------------------------

    def load(self) -> "PluginHost":
        self._add_plugin(builtin, CORE_DISTRIBUTION, _core_version())
        only = {_normalise(d) for d in _env_set("PCP_PLUGINS")}
        disabled = {_normalise(d) for d in _env_set("PCP_DISABLE_PLUGINS")}
        for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
            distribution = entry_point.dist.name if entry_point.dist else entry_point.name
            key = _normalise(distribution)
            if (only and key not in only) or key in disabled or key == CORE_DISTRIBUTION:
                continue
            version = entry_point.dist.version if entry_point.dist else "?"
            try:
                module = entry_point.load()
            except Exception as error:  # a broken plugin must not take the host down
                self._record(key, version).errors.append(f"import failed: {_short_error(error)}")
                log.warning("plugin failed to load", distribution=key, error=str(error))
                continue
            incompatible = api_mismatch(module)
            if incompatible:
                self._record(key, version).errors.append(incompatible)
                log.warning("plugin not loaded", distribution=key, reason=incompatible)
                continue
            self._add_plugin(module, key, version)
        self._fill_registries()
        if strict_mode():
            self.raise_for_errors()
        return self

    def _record(self, distribution: str, version: str) -> PluginRecord:
        return self.records.setdefault(distribution, PluginRecord(distribution, version))

    def _add_plugin(self, module: Any, distribution: str, version: str) -> None:
        record = self._record(distribution, version)
        try:
            self.manager.register(module, name=distribution)
        except Exception as error:
            record.errors.append(f"registration failed: {_short_error(error)}")

    def _fill_registries(self) -> None:
        for kind, hook_name in REGISTRY_HOOKS.items():
            for impl in getattr(self.manager.hook, hook_name).get_hookimpls():
                self._call_register_hook(kind, impl)

    def _call_register_hook(self, kind: str, impl: pluggy.HookImpl) -> None:
        record = self.records[impl.plugin_name]
        registry = self.registries[kind]

        def register(thing: Any) -> None:
            name = getattr(thing, "name", None)
            if not isinstance(name, str) or not name:
                raise TypeError(f"a registered {kind} needs a non-empty str `name`, got {thing!r}")
            registry.add(name, thing, record.distribution)
            record.registered.append((kind, name))

        try:
            impl.function(register=register)
        except Exception as error:
            record.errors.append(f"{impl.function.__name__} failed: {_short_error(error)}")
            log.warning("plugin hook failed", distribution=record.distribution, error=str(error))

    # -- queries --------------------------------------------------------------------------

    def errors(self) -> list[str]:
        return [f"{r.distribution}: {e}" for r in self.records.values() for e in r.errors]

    def raise_for_errors(self) -> None:
        problems = self.errors()
        if problems:
            raise PluginLoadError(
                "plugin errors (PCP_STRICT_PLUGINS is set): " + "; ".join(problems)
            )

    def add_commands(self, app: Any) -> None:
        for impl in self.manager.hook.pcp_register_commands.get_hookimpls():
            try:
                impl.function(app=app)
            except Exception as error:
                self.records[impl.plugin_name].errors.append(
                    f"pcp_register_commands failed: {_short_error(error)}"
                )

    def backend(self, name: str) -> "Backend":
        return self.registries["backend"].get(name)

    def optimizer(self, name: str) -> "InnerOptimizer | OuterOptimizer":
        return self.registries["optimizer"].get(name)

    def transport(self, name: str) -> "Transport":
        return self.registries["transport"].get(name)

    def codec(self, name: str) -> "Codec":
        return self.registries["codec"].get(name)

    def aggregator(self, name: str) -> "Aggregator":
        return self.registries["aggregator"].get(name)

    def algorithm(self, name: str) -> "Algorithm":
        return self.registries["algorithm"].get(name)

    def model(self, name: str) -> "Model":
        return self.registries["model"].get(name)

    def dataset(self, name: str) -> "DatasetSource":
        return self.registries["dataset"].get(name)

    def launcher(self, name: str) -> "Launcher":
        return self.registries["launcher"].get(name)

    def metric_sinks(self) -> "list[MetricSink]":
        return self.registries["metric_sink"].values()


def _core_version() -> str:
    try:
        return metadata.version(CORE_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return __version__


@cache
def host() -> PluginHost:
    """The process-wide plugin host, loaded on first use."""
    return PluginHost().load()
