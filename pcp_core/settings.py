"""Settings a plugin declares for itself, and the checks every setting goes through.

A plugin (an algorithm, an optimizer, a transport, ...) that has options of its own
gives its registered object `settings=`, a dataclass whose fields are made with
`setting(...)`. The core turns each field into a `pcp train` flag (`--inner-steps`),
a key of the TOML section named after the plugin (`[diloco]`), and the checks that
`setting` names; the run hands the plugin its settings as that dataclass
(`RunConfig.settings("diloco")`). The core's own `RunConfig` fields use the same
coercion and checks.
"""

import dataclasses
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# Bounds that settings of the core and of plugins share: far above any real run, low
# enough that a typo (an exponent too many) is a one-line error instead of an overflow, a
# huge allocation or a run with no end. Memory is checked separately, against the machine
# (pcp_core.program.resources).
MAX_SECONDS = 7 * 24 * 3600.0
MIN_SECONDS = 1.0  # the shortest timeout: below it a round or a heartbeat never completes
MAX_STEPS = 10**9


class ConfigError(ValueError):
    """A bad setting: unknown key, wrong type, out-of-range value."""


def setting(
    default: Any,
    help: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    choices: tuple[str, ...] | None = None,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A settings field: its default, its help text (shown by `pcp train --help`), and its
    range: `low`/`high` bounds (excluded with `low_open`/`high_open`), `choices`, or a
    `check` returning why a value is wrong (None if it is fine)."""
    metadata: dict[str, Any] = {"help": help, "low": low, "high": high, "low_open": low_open}
    metadata |= {"high_open": high_open, "choices": choices, "check": check}
    return dataclasses.field(default=default, metadata=metadata)


def coerce(name: str, kind: Any, value: Any) -> Any:
    """`value` (from a flag or a TOML file) as the field type `kind`, or ConfigError."""
    if value is None:
        return None
    text = str(kind)
    try:
        if "Path" in text:
            return Path(value)
        if "int" in text and not isinstance(value, bool):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if "float" in text and not isinstance(value, bool):
            return float(value)
        if "str" in text and isinstance(value, str):
            return value
        if "str" in text and isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)  # TOML's `inner_lr_scaling = 0.75`, a number a user writes bare
    except (TypeError, ValueError):
        pass
    name_of_type = text.replace("pathlib.", "").replace("<class '", "").replace("'>", "")
    raise ConfigError(f"{name}: expected {name_of_type}, got {value!r}")


def check_value(name: str, value: Any, metadata: Mapping[str, Any]) -> None:
    """ConfigError, one line naming the setting, unless `value` is within its range."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value}")
    low, high = metadata.get("low"), metadata.get("high")
    too_low = low is not None and (value <= low if metadata.get("low_open") else value < low)
    too_high = high is not None and (value >= high if metadata.get("high_open") else value > high)
    if (too_low or too_high) and low is not None and metadata.get("high_open"):
        opening = "(" if metadata.get("low_open") else "["
        raise ConfigError(f"{name} must be in {opening}{low:g}, {high:g}), got {value}")
    if too_low:
        if low == 0:
            why = "must be positive" if metadata.get("low_open") else "must not be negative"
        else:
            why = f"must be {'above' if metadata.get('low_open') else 'at least'} {low:g}"
        raise ConfigError(f"{name} {why}, got {value}")
    if too_high:
        raise ConfigError(f"{name} must be at most {high:,}, got {value:g}")
    if (choices := metadata.get("choices")) and value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}: {value!r}")
    if (check := metadata.get("check")) and (why := check(value)):
        raise ConfigError(f"{name} {why}: {value!r}")


def build(section: str, declared: type, values: Mapping[str, Any]) -> Any:
    """The plugin `section`'s settings: `declared` filled from `values` (TOML keys or
    flags) over its defaults, each value coerced and checked."""
    known = {field.name: field for field in dataclasses.fields(declared)}
    for key in values:
        if key.replace("-", "_") not in known:
            raise ConfigError(
                f"[{section}] has no setting {key!r} (it has {', '.join(known) or 'none'})"
            )
    given = {k.replace("-", "_"): v for k, v in values.items()}
    settings = declared(**{k: coerce(f"{section}.{k}", known[k].type, v) for k, v in given.items()})
    for name, field in known.items():
        check_value(f"{section}.{name}", getattr(settings, name), field.metadata)
    if callable(validate := getattr(settings, "validate", None)):
        validate()  # its checks across fields, ConfigError naming them
    return settings


def to_values(settings: Any) -> dict[str, Any]:
    """A settings dataclass as TOML values (None left out, paths as text)."""
    values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items() if v is not None}
