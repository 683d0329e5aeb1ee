"""A run's configuration from its sources, and back: the dataclass defaults, then a
command's defaults, a TOML file (`--config`, or a run's own config.toml on `--resume`),
then the flags given; each installed plugin's section (`[diloco]`) built and checked as
it declares (`pcp_core.settings`); and the TOML and records a run writes.
"""

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
import tomli_w

from pcp_core.config import FIELDS, ConfigError, RunConfig
from pcp_core.settings import build, coerce, to_values
from pcp_core.shepherd_settings import SHEPHERD, ShepherdSettings

log = structlog.get_logger(__name__)

# The kinds of registered objects that may declare settings.
KINDS_WITH_SETTINGS = ("algorithm", "optimizer", "transport", "backend", "model", "dataset")


def declared_settings(host: Any) -> dict[str, type]:
    """Every section a run config has beyond its core fields: the core's own
    (`[shepherd]`), then each installed plugin that declares settings, by its
    registered name (the TOML section), with its settings dataclass."""
    found: dict[str, type] = {SHEPHERD: ShepherdSettings}
    for kind in KINDS_WITH_SETTINGS:
        registry = host.registries[kind]
        for name, entry in registry.entries.items():
            declared = getattr(entry.value, "settings", None)
            if name not in registry.conflicts and dataclasses.is_dataclass(declared):
                found[name] = declared  # type: ignore[assignment]
    return found


def _coerce(name: str, value: Any) -> Any:
    return coerce(name, FIELDS[name].type, value)


def field_names(declared: type) -> set[str]:
    return {f.name for f in dataclasses.fields(declared)}


def load_toml(
    path: Path, declared: Mapping[str, type] | None = None
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The core settings and the plugin sections (`[diloco]`) in a TOML file, keys
    checked against the config's fields and the `declared` plugin settings. A plugin's
    setting written at the top level, as before plugins owned their settings, is read
    as if under its section, with a warning."""
    declared = declared or {}
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    core: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        owners = [plugin for plugin, kind in declared.items() if name in field_names(kind)]
        if isinstance(value, dict):
            if key not in declared:
                known = ", ".join(f"[{plugin}]" for plugin in sorted(declared)) or "none"
                raise ConfigError(
                    f"{path}: unknown section [{key}]: no installed plugin of that name "
                    f"declares settings (sections: {known})"
                )
            sections.setdefault(key, {}).update(value)
        elif name in FIELDS:
            core[name] = _coerce(name, value)
        elif owners:
            log.warning(
                "a plugin's setting at the top level of the config file: move it under "
                "its section (read as if it were there)",
                file=str(path),
                key=key,
                section=" ".join(f"[{plugin}]" for plugin in owners),
            )
            for plugin in owners:
                sections.setdefault(plugin, {})[name] = value
        else:
            raise ConfigError(f"{path}: unknown key {key!r} (see `pcp train --help`)")
    return core, sections


def resolve(
    config_file: Path | None,
    flags: dict[str, Any],
    defaults: dict[str, Any] | None = None,
    declared: Mapping[str, type] | None = None,
) -> RunConfig:
    """Defaults, then the command's defaults, the TOML file, the flags given (not None).
    `declared` are the installed plugins' settings (by plugin): each gets its section,
    and a flag that is not the core's goes to every plugin that declares a setting of
    its name (`--inner-steps` to diloco)."""
    declared = declared or {}
    settings = dict(defaults or {})
    sections: dict[str, dict[str, Any]] = {}
    if config_file:
        core, sections = load_toml(config_file, declared)
        settings.update(core)
    for name, value in flags.items():
        if value is None:
            continue
        if name in FIELDS:
            settings[name] = _coerce(name, value)
            continue
        owners = [plugin for plugin, kind in declared.items() if name in field_names(kind)]
        if not owners:
            raise ConfigError(f"unknown setting {name!r} (see `pcp train --help`)")
        for plugin in owners:
            sections.setdefault(plugin, {})[name] = value
    return with_plugin_settings(RunConfig(**settings).validate(), declared, sections)


def with_plugin_settings(
    config: RunConfig,
    declared: Mapping[str, type],
    values: Mapping[str, Mapping[str, Any]] | None = None,
) -> RunConfig:
    """`config` with the settings of every plugin in `declared`: built from `values`
    (by plugin), else from what `config.plugins` holds (a mapping, or the dataclass
    itself, as code that builds a RunConfig may give), else the defaults."""
    values = values or {}
    for plugin in config.plugins:
        if plugin not in declared:
            raise ConfigError(f"settings given for {plugin!r}, which no installed plugin is")
    plugins: dict[str, Any] = {}
    # the run's algorithm first: a bad value of a flag that several plugins share (a
    # setting of the same name) is refused in the words of the algorithm the user runs
    for plugin in sorted(declared, key=lambda name: (name != config.algorithm, name)):
        kind = declared[plugin]
        current = config.plugins.get(plugin)
        if plugin not in values and isinstance(current, kind):
            plugins[plugin] = build(plugin, kind, to_values(current))
        else:
            given = values.get(plugin, current if isinstance(current, Mapping) else {})
            plugins[plugin] = build(plugin, kind, given)
    return dataclasses.replace(config, plugins={name: plugins[name] for name in declared})


def to_toml(config: RunConfig) -> str:
    """The resolved config as TOML (None values omitted), written into every run: the
    core's settings, then a section for each plugin's.

    Written by a TOML library, so any path (backslashes, quotes, newlines) reads back
    as it was.
    """
    settings = {name: getattr(config, name) for name in FIELDS}
    document: dict[str, Any] = {
        k: str(v) if isinstance(v, Path) else v for k, v in settings.items() if v is not None
    }
    for plugin, values in sorted(config.plugins.items()):
        document[plugin] = to_values(values)
    return tomli_w.dumps(document)


def to_dict(config: RunConfig) -> dict[str, Any]:
    core = {name: getattr(config, name) for name in FIELDS}
    plugins = {plugin: to_values(values) for plugin, values in config.plugins.items()}
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in core.items()} | plugins
