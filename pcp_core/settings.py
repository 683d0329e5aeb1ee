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
from dataclasses import dataclass
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


# Named exponents of `inner_lr_scaling` (WorkersLrSettings).
INNER_LR_SCALINGS = {"sqrt": 0.5, "none": 0.0}
SCALING_WRONG = "must be auto, sqrt, none or an exponent from 0 to 1"
# `auto`: M^0.75 up to this many workers, their factor (2.83) beyond
AUTO_SCALING_UP_TO = 4


def lr_scale(scaling: str, workers: int) -> float | None:
    """What `inner_lr_scaling` multiplies --lr and --min-lr by for M = `workers`: M^p for
    a named exponent or a number p from 0 to 1, or `auto`'s M^0.75 capped at four
    workers' 2.83; None for anything else."""
    if scaling == "auto":
        return min(workers, AUTO_SCALING_UP_TO) ** 0.75
    exponent = INNER_LR_SCALINGS.get(scaling)
    if exponent is None:
        try:
            exponent = float(scaling)
        except ValueError:
            return None
    return workers**exponent if 0 <= exponent <= 1 else None


@dataclass(frozen=True)
class WorkersLrSettings:
    """The workers' learning rate in an algorithm whose M workers each train on 1/M of
    a step's batch and whose rounds merge their moves (DiLoCo's, SparseLoCo's): settings
    such an algorithm's own settings inherit, so every one of them has the same flags
    (`--inner-lr-scaling`, `--inner-warmup-steps`) and the same rule (`with_workers_lr`)."""

    # A worker's batch is 1/M of the batch that M workers' averaged step sees, and Adam's
    # progress per step in the noisy regime grows about with the square root of the batch;
    # averaging M workers cancels their noise, so they can take larger steps still. M^0.75
    # trained closer to synchronous training than √M or the lr as given, with the larger lr
    # warmed up (below) so that the first rounds do not stall. Past four workers (a batch of
    # 4 or 2 a worker) a larger factor lost, so it stays at four workers' 2.83
    # (docs/diloco-quality.md, "Eight and sixteen workers").
    inner_lr_scaling: str = setting(
        "auto",
        "the workers' inner learning rate is --lr and --min-lr (those of training "
        "the same tokens a step on one machine) times a factor of M, the number of "
        "workers: auto (M^0.75 up to four workers, 4^0.75 = 2.83 from there), an "
        "exponent p from 0 to 1 (M^p), `sqrt` (0.5) or `none` (0: the lr as given, e.g. "
        "one tuned for the workers).",
        check=lambda value: None if lr_scale(value, 1) is not None else SCALING_WRONG,
    )
    inner_warmup_steps: int = setting(
        400,
        "The workers' learning rate warms up over this many steps (at most a third of "
        "--steps) where that is longer than --warmup-steps; from scratch a shorter warm-up "
        "to the scaled lr stalls the first rounds. 0: --warmup-steps alone.",
        low=0,
        high=MAX_STEPS,
    )

    def with_workers_lr(self, config: Any) -> Any:
        """The run's config (a `RunConfig`, which is built on this module) with the
        workers' learning rates (--lr and --min-lr times the factor
        of `inner_lr_scaling` for its M) and warm-up (`inner_warmup_steps`, at most a
        third of --steps, where longer than --warmup-steps)."""
        scale = lr_scale(self.inner_lr_scaling, config.shepherd.workers) or 1.0
        warmup = min(self.inner_warmup_steps, config.steps // 3)
        return dataclasses.replace(
            config,
            lr=config.lr * scale,
            min_lr=config.final_lr() * scale,
            warmup_steps=max(config.warmup_steps, warmup),
        )
