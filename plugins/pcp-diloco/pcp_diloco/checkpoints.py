"""What a DiLoCo checkpoint keeps besides the parameters, and how `--resume` reads it
back: where the run is (`RunState`), the outer optimizer's state, the copy of the
parameters the workers hold, and the aggregator's and the workers' strikes' state."""

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from pcp_core.engine import HELD_PREFIX, RunContext, Shepherd
from pcp_diloco.outer_steps import FragmentSteps

log = structlog.get_logger(__name__)

AGGREGATOR_PREFIX = "aggregator."  # the aggregator's state in a checkpoint


@dataclass
class Judged:
    """What a checkpoint keeps of the aggregator and of the workers' strikes."""

    aggregator: dict[str, np.ndarray]
    accountability: dict[str, Any]


@dataclass
class RunState:
    """Where the run is: saved with every checkpoint, so `--resume` continues from it."""

    run_id: str  # a worker's saved inner state is only used for the same run id
    next_round: int = 0
    tokens: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    val_loss: float | None = None
    schedule_step: int | None = None  # None: next_round × H (a checkpoint from before)

    def position(self, round_steps: int) -> int:
        """The steps of the run's schedule behind it: H a round, or, in budgeted rounds,
        the steps the leading worker of each round ran."""
        if self.schedule_step is None:
            return self.next_round * round_steps
        return self.schedule_step

    def goes_on(self, round_steps: int, steps: int) -> bool:
        """Whether another round fits in the run's --steps."""
        return self.position(round_steps) + round_steps <= steps

    def metadata(self) -> dict[str, Any]:
        return {"diloco": dataclasses.asdict(self)}


def resume(
    ctx: RunContext, setup: Any, params: list[np.ndarray], outer_step: Any
) -> tuple[RunState, dict[str, np.ndarray], Judged]:
    """Load the last intact checkpoint of the run directory into `params` and the outer
    optimizer; drop the metrics of rounds after it (they are run again). Returns where
    the run is, the copy of the parameters the workers held (`Downlink.load_state`) and
    the aggregator's and the strikes' state."""
    metadata, tensors = setup.resume_from(ctx.run_dir, params, "diloco")
    state = RunState(**json.loads(metadata["diloco"]))
    held = {k: v for k, v in tensors.items() if k.startswith(HELD_PREFIX)}
    aggregator = {
        k.removeprefix(AGGREGATOR_PREFIX): v
        for k, v in tensors.items()
        if k.startswith(AGGREGATOR_PREFIX)
    }
    names = set(setup.param_names()) | set(held) | {AGGREGATOR_PREFIX + k for k in aggregator}
    outer_step.load_state({k: v for k, v in tensors.items() if k not in names})
    ctx.metrics.keep_only(lambda record: record.get("round", -1) < state.next_round)
    log.info("resuming", run_dir=str(ctx.run_dir), round=state.next_round)
    judged = Judged(aggregator, json.loads(metadata.get("accountability", "{}")))
    return state, held, judged


def saved_state(
    outer_step: FragmentSteps, shepherd: Shepherd, state: RunState
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """What a round's checkpoint keeps besides the parameters, as `resume` reads it: its
    tensors (the outer optimizer's state, the copy the workers hold, the aggregator's
    state) and its metadata (where the run is, the workers' strikes)."""
    # the outer optimizer's state and the copy the workers hold, copied as the
    # parameters are: the next round changes them while this one is written
    extra = {name: array.copy() for name, array in outer_step.state().items()}
    extra |= shepherd.downlink().state()
    extra |= {
        AGGREGATOR_PREFIX + name: array.copy()
        for name, array in shepherd.merger.combiner.state().items()
    }
    metadata = state.metadata() | {"accountability": shepherd.merger.accountability.state()}
    return extra, metadata
