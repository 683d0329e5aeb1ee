"""DiLoCo's plan of a run, before any round: the config the workers' program is built
from (H, the outer momentum and the inner optimizer's settings chosen for M workers) and
the number of rounds, the checks across settings, and what every worker is told about
the run with its program (`run_settings`)."""

import dataclasses
import math
from typing import Any

from pcp_core.engine import ConfigError, RunConfig, RunSettings
from pcp_diloco.settings import DilocoSettings, DilocoWorkerSettings, defaults_for


def plan(config: RunConfig, plugins: Any) -> tuple[RunConfig, int]:
    """The config the workers' program is built from, and the number of rounds: H and the
    outer momentum chosen for its M where left to the default (DilocoSettings.for_workers),
    a steps-per-call that divides a round's steps (H, or H/P with P fragments), the
    workers' learning rates and warm-up (`WorkersLrSettings.with_workers_lr`) and the
    momentum decay of `inner_momentum_decay`."""
    given: DilocoSettings = config.settings("diloco")
    diloco = given.for_workers(config.shepherd.workers, config.steps)
    assert diloco.inner_steps is not None  # chosen by for_workers
    if config.steps % diloco.inner_steps:
        raise ConfigError(
            f"steps ({config.steps}) must be a multiple of inner_steps ({diloco.inner_steps})"
        )
    if config.shepherd.spot_check and (
        diloco.overlap != "none" or diloco.fragments > 1 or diloco.round_budget != "steps"
    ):
        raise ConfigError(
            "--spot-check re-runs whole rounds of the whole model as a worker ran them: "
            "it needs --overlap none, --fragments 1 and --round-budget steps"
        )
    steps_per_call = math.gcd(config.steps_per_call, diloco.round_steps)
    planned = dataclasses.replace(
        diloco.with_workers_lr(config),
        steps_per_call=steps_per_call,
        plugins={**config.plugins, "diloco": diloco, **inner_momentum_decay(config, plugins)},
    )
    return planned, config.steps // diloco.round_steps


def inner_momentum_decay(config: RunConfig, plugins: Any) -> dict[str, Any]:
    """The inner optimizer's own settings with the workers' momentum decay
    (`--inner-momentum-decay`, or its default where the optimizer's own is left at its
    default and rounds do not overlap), as `config.plugins` holds them; empty for an
    optimizer that declares none."""
    name = getattr(plugins.optimizer(config.optimizer), "momentum_decay_setting", None)
    own = config.plugins.get(config.optimizer)
    if name is None or own is None:
        return {}
    diloco: DilocoSettings = config.settings("diloco")
    chosen = diloco.inner_momentum_decay
    if chosen is None:
        declared = {field.name: field.default for field in dataclasses.fields(own)}
        if getattr(own, name) != declared[name] or diloco.overlap != "none":
            return {}
        chosen = defaults_for(config.shepherd.workers).inner_momentum_decay
    return {config.optimizer: dataclasses.replace(own, **{name: chosen})}


def schedule_counters(config: RunConfig, plugins: Any, program: Any) -> list[str]:
    """The inner-state tensors a worker sets to the run's position in budgeted rounds
    (`pcp_diloco.budgets`): its optimizer's step counter, whose schedule then follows
    the run's rounds; none under `--round-budget steps` or for an optimizer without one."""
    diloco: DilocoSettings = config.settings("diloco")
    field = getattr(plugins.optimizer(config.optimizer), "step_field", None)
    if diloco.round_budget == "steps" or field is None:
        return []
    return program.opt_field_names(field)


def momentum_to_reset(config: RunConfig, plugins: Any, program: Any) -> list[str]:
    """The inner-state tensors a worker zeroes at the start of each round: the inner
    optimizer's momentum under `--inner-momentum reset`, nothing under `keep` or for an
    optimizer that declares no momentum."""
    diloco: DilocoSettings = config.settings("diloco")
    field = getattr(plugins.optimizer(config.optimizer), "momentum_field", None)
    if diloco.inner_momentum == "keep" or field is None:
        return []
    return program.opt_field_names(field)


def run_settings(config: RunConfig, plugins: Any, program: Any, run_id: str) -> RunSettings:
    """What every worker is told about the run with its program: DiLoCo's worker settings
    (the momentum it resets, its fragments, the schedule counters of budgeted rounds),
    how rounds overlap, how deltas and parameters cross, and whether it is audited."""
    diloco: DilocoSettings = config.settings("diloco")
    reset = momentum_to_reset(config, plugins, program)
    counters = schedule_counters(config, plugins, program)
    return RunSettings(
        algorithm="diloco",
        run_id=run_id,
        # a resumed run asks again for up to checkpoint_every rounds, one more where the
        # last checkpoint was still being written: each needs the inner state it started
        # from (pcp_core.worker.state)
        inner_states_kept=config.shepherd.checkpoint_every + 2,
        plugins={"diloco": DilocoWorkerSettings(tuple(reset), diloco.fragments, tuple(counters))},
        overlap=diloco.overlap != "none",
        push_deltas=diloco.deltas == "pushed",  # and under ahead (RunSettings.pushes)
        ahead=diloco.ahead_rounds if diloco.overlap == "ahead" else 0,
        codec=diloco.codec,
        codec_down=diloco.codec_down,
        audited=config.shepherd.spot_check > 0,
    )
