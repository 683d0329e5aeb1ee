"""DiLoCo's own settings: the `[diloco]` section of a run's TOML and their flags
(`--inner-steps`, `--outer-lr`, ...), declared as PCP plugins declare settings; and
what its worker side is told with the program."""

from dataclasses import dataclass, replace
from typing import NamedTuple

from pcp_core.settings import MAX_STEPS, ConfigError, WorkersLrSettings, setting


@dataclass(frozen=True)
class DilocoSettings(WorkersLrSettings):
    """What `pcp train --algorithm diloco` adds to a run's settings (the workers' learning
    rate, `inner_lr_scaling` and `inner_warmup_steps`, as every algorithm of M workers on
    1/M of a step's batch has it: `WorkersLrSettings`)."""

    inner_steps: int | None = setting(
        None,
        "Inner steps per round (H). Default: by the number of workers M, 50 up to two, 20 "
        "beyond (the largest divisor of --steps not above that).",
        low=0,
        low_open=True,
        high=MAX_STEPS,
    )
    outer_optimizer: str = setting("nesterov", "Outer optimizer run by the shepherd.")
    # An outer momentum of 0.9 (the DiLoCo paper's) carries every pseudo-gradient for about
    # ten rounds, half of a run from scratch. Against synchronous training at equal tokens
    # (benchmarks/diloco_quality.py), with the workers' inner lr and warm-up below, 0.7
    # lost least, 0.5 and 0.3 more. Past two workers the rounds are shorter and more
    # (DEFAULTS_BY_WORKERS): 0.8 there. docs/diloco-quality.md has the trials.
    outer_lr: float = setting(1.0, "Outer learning rate.", low=0, low_open=True)
    outer_momentum: float | None = setting(
        None,
        "Outer Nesterov momentum. Default: 0.7 up to two workers, 0.8 beyond, whose rounds "
        "are shorter (the paper's 0.9 suits thousands of rounds).",
        low=0,
        high=1,
        high_open=True,
    )
    # A worker's AdamW first moment at the end of a round is the direction of its own
    # last steps, which the outer step has just replaced; carried into the next round it
    # pulls the worker back along its own path. Zeroed (the first steps of a round then
    # also move less while it rebuilds, over about 1/(1 - beta1) steps), four workers
    # trained closer to synchronous training and two about as close
    # (docs/diloco-quality.md, `--inner-momentum reset`).
    inner_momentum: str = setting(
        "reset",
        "A worker's inner optimizer momentum at the start of a round: reset (zeroed) "
        "or keep (carried over, as in the DiLoCo paper).",
        choices=("reset", "keep"),
    )
    # A worker's batch is 1/M of the step's, its momentum zeroed each round: a shorter
    # memory than the synchronous 0.9's ten steps suits it (docs/diloco-quality.md, "The
    # workers' first moment"); by M below (DEFAULTS_BY_WORKERS). Measured without overlap
    # only: overlapped rounds fold in stale moves, and there (test_overlap's 120-step run)
    # 0.8 ended above 0.9, so they keep --beta1.
    inner_momentum_decay: float | None = setting(
        None,
        "The workers' momentum decay (AdamW's beta1 on the workers). Default, where "
        "--beta1 is left at its 0.9: 0.7 up to eight workers M, 0.8 beyond (a memory of "
        "three or five steps rather than ten: a worker's batch is 1/M of a step's, its "
        "momentum zeroed each round), under --overlap none; a --beta1 that is set, or "
        "overlapped rounds, keep --beta1.",
        low=0,
        high=1,
        high_open=True,
    )
    # Averaging the first rounds instead of a Nesterov step (which moves 1 + momentum
    # times the run's largest pseudo-gradients) gained 0.7-2 points with two workers and
    # the lr as given; with the scaled lr and warm-up above it helped on two corpora and
    # hurt on three (four workers), so it is off.
    outer_warmup_rounds: int = setting(
        0,
        "First rounds that take the plain average of the workers' models (outer lr "
        "1, no momentum) before the outer optimizer starts; 2 gained 1-2 points with two "
        "workers under --inner-lr-scaling none, and was mixed with the scaled lr.",
        low=0,
        high=MAX_STEPS,
    )
    overlap: str = setting(
        "none",
        "none: a worker waits for the new global parameters after each round; delayed: "
        "it starts the next round at once from them as last received plus its own last "
        "round, so the network hides behind the inner steps; "
        "ahead: as delayed, and a round that ends before its Assignment is reported at "
        "once, up to --ahead-rounds of them (so the network may take that many rounds' "
        "steps and one more; implies --deltas pushed).",
        choices=("none", "delayed", "ahead"),
    )
    ahead_rounds: int = setting(
        1,
        "Under --overlap ahead: how many rounds a worker may report before their "
        "Assignments arrive. Each more hides a longer network, and computes each round "
        "from a point one more outer step old.",
        low=1,
        high=8,
    )
    deltas: str = setting(
        "fetched",
        "How pseudo-gradients reach the shepherd: fetched (each Result first, its Delta "
        "when the shepherd asks: it holds a few at a time) or pushed (each Delta right "
        "after its Result: a round trip less a round, the shepherd holding one delta per "
        "worker at a time).",
        choices=("fetched", "pushed"),
    )
    codec: str = setting(
        "fp4",
        "How a worker's pseudo-gradient crosses the link (pcp_core.codecs): fp4 (4-bit "
        "floats, 9x fewer bytes than float32; each measured mean within 0.6% of float32's "
        "loss: docs/codecs.md), "
        "f32 (float32 as it is), or another registered codec such as bf16, int8 or topk "
        "(`pcp plugins` lists them). The shepherd sums the decoded float32 values.",
        check=lambda name: unknown_codec(name),
    )
    codec_down: str = setting(
        "fp4",
        "How the new global parameters cross to the workers: "
        "f32 (float32 values), or a registered codec such as fp4: each round sends the encoded "
        "change to the copy a worker holds, which stays equal to the shepherd's bit for "
        "bit; a worker that (re)joins gets the whole copy in float32.",
        check=lambda name: unknown_codec(name),
    )
    round_budget: str = setting(
        "steps",
        "What a round asks of each worker. steps: --inner-steps steps each, so a round "
        "lasts as long as its slowest worker. auto: the time the fastest worker takes for "
        "--inner-steps steps (measured from its reports, round after round; at least the "
        "slowest worker's one call), each worker "
        "running as many steps as fit, so unequal machines report together and none "
        "idles. A duration such as 30s: that many seconds each. A budgeted worker runs "
        "at least one call and at most 4 x --inner-steps steps; the learning-rate "
        "schedule and --steps follow the steps of each round's leading worker "
        "(pcp_diloco.budgets).",
        check=lambda value: None if budget_seconds(value) is not None else BUDGET_WRONG,
    )
    merge: str = setting(
        "tokens",
        "How the accepted pseudo-gradients of a round are combined: tokens (weighted by "
        "the inner steps each worker ran: unequal workers count for the work they did) "
        "or mean (each counts the same). Equal with --round-budget steps.",
        choices=("tokens", "mean"),
    )
    fragments: int = setting(
        1,
        "Streaming fragments P: the parameters split into P groups, each synchronised "
        "every --inner-steps steps, one group a round of H/P steps, so a round moves 1/P "
        "of the model each way (pcp_diloco.fragments). 1: the whole model every round.",
        low=1,
        high=64,
    )

    def validate(self) -> None:
        """The checks across fields, after each field's own (H once it is chosen)."""
        if self.inner_steps is not None and self.inner_steps % self.fragments:
            raise ConfigError(
                f"diloco.inner_steps ({self.inner_steps}) must be a multiple of fragments "
                f"({self.fragments}): a round is inner_steps / fragments steps"
            )

    @property
    def round_steps(self) -> int:
        """Inner steps a round takes: H, or H/P with streaming fragments (of settings
        whose H is chosen: `for_workers`)."""
        assert self.inner_steps is not None, "H is chosen by for_workers first"
        return self.inner_steps // self.fragments

    def for_workers(self, workers: int, steps: int) -> "DilocoSettings":
        """These settings with H and the outer momentum chosen for M = `workers` where
        they were left to the default, for a run of `steps` steps (a chosen H is one that
        the fragments divide: rounds_for)."""
        return replace(
            self,
            inner_steps=self.inner_steps or rounds_for(workers, steps, self.fragments),
            outer_momentum=(
                self.outer_momentum
                if self.outer_momentum is not None
                else defaults_for(workers).outer_momentum
            ),
        )


class WorkerCountDefaults(NamedTuple):
    """What DiLoCo chooses for up to `most_workers` workers, where the user leaves it."""

    most_workers: int
    inner_steps: int  # H (rounds_for fits it to --steps)
    outer_momentum: float
    inner_momentum_decay: float  # the workers' beta1, where --beta1 is left at 0.9


# Chosen against synchronous training at equal tokens (benchmarks/diloco_quality.py;
# docs/diloco-quality.md, "The defaults by M" and "H = 20 from three workers"). Past two
# workers shorter rounds (H = 20) and a higher outer momentum (0.8), which carries each
# pseudo-gradient over about five rounds, took the gap to synchronous training down by
# more than half, for more bytes; two workers are at or below synchronous with H = 50 and
# 0.7, at fewer bytes. The workers' beta1 is 0.7 up to eight workers; with sixteen (two
# sequences a worker) 0.7 lost to 0.8, so the longer memory stays there.
DEFAULTS_BY_WORKERS = (
    WorkerCountDefaults(2, 50, 0.7, 0.7),
    WorkerCountDefaults(8, 20, 0.8, 0.7),
    WorkerCountDefaults(MAX_STEPS, 20, 0.8, 0.8),
)


def defaults_for(workers: int) -> WorkerCountDefaults:
    """DEFAULTS_BY_WORKERS' row for M = `workers`."""
    return next(row for row in DEFAULTS_BY_WORKERS if workers <= row.most_workers)


def rounds_for(workers: int, steps: int, fragments: int = 1) -> int:
    """The default H for M = `workers` (DEFAULTS_BY_WORKERS): the largest divisor of
    `steps` not above it that `fragments` divides, so that the run is whole rounds;
    ConfigError where that would be under half of it (a round would talk twice as often:
    pass --inner-steps)."""
    target = defaults_for(workers).inner_steps
    most = min(target, steps)
    fits = [h for h in range(most, 0, -1) if steps % h == 0 and h % fragments == 0]
    if not fits or 2 * fits[0] < most:
        of_fragments = f" that fragments ({fragments}) divides" if fragments > 1 else ""
        whole = max(target - target % fragments, fragments)  # a round of whole fragments
        raise ConfigError(
            f"no inner_steps for {workers} workers: steps ({steps}) has no divisor from "
            f"{(most + 1) // 2} to {most}{of_fragments}; pass --inner-steps, or --steps a "
            f"multiple of {whole}"
        )
    return fits[0]


BUDGET_WRONG = "must be steps, auto or a duration in seconds such as 30s"


def budget_seconds(value: str) -> float | None:
    """--round-budget as seconds: 0 for steps, -1 for auto, the duration of "30s"; None
    for anything else."""
    if value in ("steps", "auto"):
        return 0.0 if value == "steps" else -1.0
    try:
        seconds = float(value.removesuffix("s"))
    except ValueError:
        return None
    return seconds if value.endswith("s") and 0 < seconds < float("inf") else None


def unknown_codec(name: str) -> str | None:
    """Why `name` is no codec here (with the package that has it), or None."""
    from pcp_core.engine import UnknownNameError, host  # here: keeps plugin discovery fast

    try:
        host().codec(name)
    except UnknownNameError as error:
        return f"names no codec here ({error})"
    return None


@dataclass(frozen=True)
class DilocoWorkerSettings:
    """What DiLoCo's worker side is told with its program (its `Algorithm.worker_settings`,
    in its slot of the Setup's settings): the inner-state tensors it zeroes for the
    parameters it takes in from the shepherd, when it takes them in (its momentum, under
    `--inner-momentum reset`), the number of streaming fragments, and the step counters
    of its schedule."""

    zero_at_round_start: tuple[str, ...] = ()
    fragments: int = 1
    # the inner optimizer's step counters, set to the run's position in budgeted rounds
    schedule_counters: tuple[str, ...] = ()
