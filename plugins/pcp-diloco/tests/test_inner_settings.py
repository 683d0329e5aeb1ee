"""The workers' inner optimizer settings that DiLoCo's plan derives from the run's flags:
`--inner-lr-scaling` (default auto) multiplies --lr and --min-lr by M^0.75 up to four
workers and by 4^0.75 beyond, and
`--inner-warmup-steps` (default 400) lengthens the warm-up, and the momentum decay
(AdamW's beta1) is `--inner-momentum-decay`'s, 0.7 up to eight workers and 0.8 beyond
where --beta1 is left at 0.9; nothing else changes. H and the outer momentum, left to
their defaults, are chosen by M. And the inner state a worker zeroes at each round's
start: `--inner-momentum reset` (default) names AdamW's first moments."""

import dataclasses
import math

import pytest
from pcp_diloco.planning import momentum_to_reset, plan

from pcp_core import config, config_file, plugins
from pcp_core.config_file import declared_settings
from pcp_core.optimizers import InnerSettings
from pcp_core.program import training

FLAGS = {"algorithm": "diloco", "steps": 1000, "inner_steps": 50}
HOST = plugins.host()
DECLARED = declared_settings(HOST)


def workers_inner(flags: dict) -> InnerSettings:
    """The inner settings the shepherd compiles into the program it ships to workers."""
    planned, _ = plan(config_file.resolve(None, FLAGS | flags, declared=DECLARED), HOST)
    return training.inner_settings(planned)


@pytest.mark.parametrize(("workers", "auto"), [(1, 1.0), (2, 2**0.75), (4, 2**1.5), (8, 2**1.5)])
def test_the_scaling_multiplies_lr_and_min_lr_by_a_power_of_the_workers(
    workers: int, auto: float
) -> None:
    inner = workers_inner({"workers": workers})
    assert inner.lr == pytest.approx(3e-3 * auto)  # M^0.75, at most four workers' factor
    assert inner.min_lr == pytest.approx(3e-4 * auto)  # a tenth of lr, scaled
    power = workers_inner({"workers": workers, "inner_lr_scaling": "0.75"})
    assert power.lr == pytest.approx(3e-3 * workers**0.75)  # a number: M^p for every M
    root = workers_inner({"workers": workers, "inner_lr_scaling": "sqrt"})
    assert root.lr == pytest.approx(3e-3 * math.sqrt(workers))
    assert workers_inner({"workers": workers, "inner_lr_scaling": "0.5"}) == root
    assert workers_inner({"workers": workers, "inner_lr_scaling": 0.5}) == root  # TOML's number
    as_given = workers_inner({"workers": workers, "inner_lr_scaling": "none"})
    assert (as_given.lr, as_given.min_lr) == pytest.approx((3e-3, 3e-4))
    assert inner.warmup_steps == as_given.warmup_steps == 333  # 400 steps, at most a third
    # the rest of the inner schedule and optimizer is the user's
    assert inner == InnerSettings(**{**vars(as_given), "lr": inner.lr,
                                              "min_lr": inner.min_lr})  # fmt: skip


def test_an_explicit_min_lr_and_worker_backends_count_too() -> None:
    flags = {"worker_backends": "cpu,cpu,cpu,cpu", "lr": 1e-3, "min_lr": 0.0}
    inner = workers_inner(flags | {"inner_lr_scaling": "sqrt"})
    assert (inner.lr, inner.min_lr) == pytest.approx((2e-3, 0.0))


def test_the_user_config_is_left_as_given() -> None:
    given = config_file.resolve(None, FLAGS | {"workers": 4}, declared=DECLARED)
    plan(given, HOST)
    assert (given.lr, given.min_lr) == (3e-3, None)


@pytest.mark.parametrize(
    ("flags", "warmup"),
    [
        ({}, 333),  # 400 steps is more than a third of the run
        ({"inner_warmup_steps": 300}, 300),
        ({"inner_warmup_steps": 100}, 100),
        ({"inner_warmup_steps": 0}, 20),  # --warmup-steps alone
        ({"warmup_steps": 400}, 400),  # --warmup-steps where it is longer
        ({"steps": 300}, 100),  # at most a third of the run
        ({"inner_steps": 10}, 333),  # whatever H is
        ({"workers": 8}, 333),  # whatever M is
    ],
)
def test_the_warmup_is_the_longer_of_its_steps_and_warmup_steps(flags: dict, warmup: int) -> None:
    inner = workers_inner({"workers": 2} | flags)
    assert inner.warmup_steps == warmup
    assert inner.total_steps == (flags.get("steps") or 1000)


@pytest.mark.parametrize(
    ("flags", "beta1"),
    [
        ({}, 0.7),  # --beta1 left at its default 0.9: the workers' default
        ({"workers": 8}, 0.7),
        ({"workers": 9}, 0.8),  # past eight workers (a batch of 2-3 a worker): 0.8
        ({"workers": 16}, 0.8),
        ({"beta1": 0.95}, 0.95),  # a --beta1 that is set is used as given
        ({"inner_momentum_decay": 0.8}, 0.8),
        ({"inner_momentum_decay": 0.8, "beta1": 0.95}, 0.8),
        ({"inner_momentum_decay": 0.9}, 0.9),  # the synchronous decay, asked for
        ({"overlap": "delayed"}, 0.9),  # overlapped rounds keep --beta1
        ({"overlap": "ahead", "inner_momentum_decay": 0.8}, 0.8),
    ],
)
def test_the_workers_momentum_decay(flags: dict, beta1: float) -> None:
    inner = workers_inner({"workers": 2} | flags)
    assert inner.own.beta1 == beta1
    # the rest of AdamW's settings is the user's
    assert (inner.own.beta2, inner.own.weight_decay) == (0.99, 0.1)


def chosen(flags: dict) -> tuple[int, float]:
    """H and the outer momentum of the run `flags` describe, as the shepherd plans it."""
    planned, rounds = plan(config_file.resolve(None, flags, declared=DECLARED), HOST)
    diloco = planned.settings("diloco")
    assert rounds * diloco.round_steps == planned.steps
    return diloco.inner_steps, diloco.outer_momentum


@pytest.mark.parametrize(
    ("workers", "steps", "expected"),
    [
        (1, 1000, (50, 0.7)),
        (2, 1000, (50, 0.7)),
        (3, 1000, (20, 0.8)),
        (8, 1000, (20, 0.8)),
        (9, 1000, (20, 0.8)),
        (16, 1000, (20, 0.8)),
        (8, 300, (20, 0.8)),
        (8, 30, (15, 0.8)),  # the largest divisor of --steps not above 20
        (8, 10, (10, 0.8)),  # a run shorter than a round: one round
    ],
)
def test_h_and_the_outer_momentum_follow_the_workers(
    workers: int, steps: int, expected: tuple[int, float]
) -> None:
    flags = {"algorithm": "diloco", "workers": workers, "steps": steps}
    assert chosen(flags) == expected
    # what the user sets is kept
    assert chosen(flags | {"inner_steps": steps, "outer_momentum": 0.5}) == (steps, 0.5)
    assert chosen(flags | {"outer_momentum": 0.0})[1] == 0.0


def test_a_chosen_h_is_one_that_the_fragments_divide() -> None:
    assert chosen({"algorithm": "diloco", "workers": 8, "steps": 1000, "fragments": 2}) == (
        20,
        0.8,
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"workers": 8, "steps": 1006},
            "no inner_steps for 8 workers: steps (1006) has no divisor from 10 to 20; "
            "pass --inner-steps, or --steps a multiple of 20",
        ),
        (
            {"workers": 2, "steps": 20, "fragments": 3},
            "no inner_steps for 2 workers: steps (20) has no divisor from 10 to 20 that "
            "fragments (3) divides; pass --inner-steps, or --steps a multiple of 48",
        ),
    ],
)
def test_steps_without_a_fitting_h_are_refused_in_one_line(flags: dict, message: str) -> None:
    with pytest.raises(config.ConfigError) as refused:
        chosen({"algorithm": "diloco"} | flags)
    assert str(refused.value) == message


def test_the_momentum_a_worker_zeroes_is_adamws_first_moment() -> None:
    given = config_file.resolve(
        None, FLAGS | {"n_layer": 1, "n_embd": 32, "n_head": 2}, declared=DECLARED
    )
    setup = training.prepare(plan(given, HOST)[0], HOST)
    names = [spec.name for spec in setup.program.opt_specs]
    first_moments = [name for name in names if name.startswith("opt.mu[")]
    assert len(first_moments) == len(setup.program.param_specs)
    assert momentum_to_reset(given, plugins.host(), setup.program) == first_moments
    keep = dataclasses.replace(given.settings("diloco"), inner_momentum="keep")
    kept = dataclasses.replace(given, plugins={**given.plugins, "diloco": keep})
    assert momentum_to_reset(kept, plugins.host(), setup.program) == []


SCALING_MESSAGE = "diloco.inner_lr_scaling must be auto, sqrt, none or an exponent from 0 to 1: "


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        *(
            ({"inner_lr_scaling": bad}, SCALING_MESSAGE + repr(bad))
            for bad in ("linear", "1.5", "-0.5", "nan")
        ),
        ({"inner_warmup_steps": -1}, "diloco.inner_warmup_steps must not be negative, got -1"),
        ({"outer_warmup_rounds": -2}, "diloco.outer_warmup_rounds must not be negative, got -2"),
        ({"inner_momentum": "zero"}, "diloco.inner_momentum must be one of reset, keep: 'zero'"),
        ({"outer_lr": float("-inf")}, "diloco.outer_lr must be a finite number, got -inf"),
        ({"outer_momentum": 1.5}, "diloco.outer_momentum must be in [0, 1), got 1.5"),
        ({"outer_lr": 0.0}, "diloco.outer_lr must be positive, got 0.0"),
        ({"outer_lr": -0.7}, "diloco.outer_lr must be positive, got -0.7"),
        ({"inner_steps": 0}, "diloco.inner_steps must be positive, got 0"),
    ],
)
def test_bad_values_are_refused_in_one_line(flags: dict, message: str) -> None:
    with pytest.raises(config.ConfigError) as refused:
        config_file.resolve(None, FLAGS | flags, declared=DECLARED)
    assert str(refused.value) == message


def test_a_diloco_section_in_toml_sets_them_and_a_flat_key_still_works(tmp_path) -> None:
    """`[diloco]` in a config file; the flat key of old config files is read as if it
    were under the section; an unknown key in the section is one line naming it."""
    toml = tmp_path / "run.toml"
    toml.write_text('algorithm = "diloco"\nsteps = 100\n[diloco]\ninner_steps = 20\n')
    assert config_file.resolve(toml, {}, declared=DECLARED).settings("diloco").inner_steps == 20
    toml.write_text('algorithm = "diloco"\nsteps = 100\ninner_steps = 25\n')
    assert config_file.resolve(toml, {}, declared=DECLARED).settings("diloco").inner_steps == 25
    toml.write_text("[diloco]\ninner_stepz = 20\n")
    with pytest.raises(config.ConfigError, match=r"\[diloco\] has no setting 'inner_stepz'"):
        config_file.resolve(toml, {}, declared=DECLARED)


def test_the_run_directory_keeps_the_section(tmp_path) -> None:
    resolved = config_file.resolve(None, FLAGS | {"outer_lr": 0.8}, declared=DECLARED)
    saved = tmp_path / "config.toml"
    saved.write_text(config_file.to_toml(resolved))
    assert "[diloco]" in saved.read_text()
    assert config_file.resolve(saved, {}, declared=DECLARED) == resolved
