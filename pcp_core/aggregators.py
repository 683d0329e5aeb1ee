"""Aggregators: how the shepherd merges a round's pseudo-gradients, a plugin kind.

A plain mean lets one worker that holds a credential move the model anywhere: a sign
flipped at five times its norm ruins a run. An aggregator plugin registers `Aggregator`
objects (`pcp_register_aggregators`); `--aggregator NAME` chooses one. Each run gets its
own `Combiner` (`Aggregator.create`), which may keep state from round to round (centered
clipping keeps its centre) and hands that state to the run's checkpoints.

The core gives a combiner every accepted pseudo-gradient of one round at once, in the
order of the workers' indices, with a positive weight each (1, or the inner steps it ran
under `--merge tokens`), and the arrays to write the result into. A round may return only
part of the model (DiLoCo's streaming fragments): `key` names the part, and rounds of one
key are given arrays of the same shapes. An aggregator that `streams` (the mean) is
instead summed by the core as the results arrive, in memory that does not grow with the
number of workers; every other one holds the round's results, one model copy a worker.

What the core does around it (`pcp_core.shepherd.accountability`): it scores each result
against the combined one, leaves out and names the results that disagree, and
quarantines a worker after repeated strikes. The conformance suite for the kind is
`pcp_core.testing.aggregator_suite`.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

Delta = list[np.ndarray]  # one worker's pseudo-gradient: the round's parameters, in order


class Combiner(Protocol):
    """One run's aggregator."""

    def combine(
        self, key: int, deltas: Sequence[Delta], weights: Sequence[float], out: Delta
    ) -> Sequence[float] | None:
        """Write the merge of `deltas` (at least one; weights positive) into `out`, and
        return how much each delta counted in it (1: in full, 0: not at all; None: the
        aggregator does not say). It changes no state (the core may call it twice in a
        round, the second time without the results it left out) and keeps no reference
        to the deltas past the call."""

    def accept(self, key: int, merged: Delta) -> None:
        """The round of `key` was kept with `merged` (for a combiner that remembers)."""

    def state(self) -> dict[str, np.ndarray]:
        """What the run's checkpoint keeps of it (names of its own choosing)."""

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Continue from what `state` returned (a resumed run); a missing name is a
        `KeyError` naming it."""


@dataclass(frozen=True)
class Aggregator:
    name: str
    description: str
    create: Callable[[], Combiner]
    # the weighted mean, summed as results arrive (`pcp_core.shepherd.aggregation.RunningSum`)
    streams: bool = False


class Stateless:
    """A combiner that keeps nothing between rounds."""

    def accept(self, key: int, merged: Delta) -> None:
        pass

    def state(self) -> dict[str, np.ndarray]:
        return {}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        pass


class Mean(Stateless):
    """The weighted mean, in float64 so that it does not depend on the order."""

    def combine(
        self, key: int, deltas: Sequence[Delta], weights: Sequence[float], out: Delta
    ) -> None:
        from pcp_core.parallel import pieces  # here: plugin discovery imports this module

        share = np.asarray(weights, np.float64) / float(np.sum(weights))

        def merge(target: np.ndarray, *parts: np.ndarray) -> None:
            total = np.zeros(target.shape, np.float64)
            for part, weight in zip(parts, share, strict=True):
                total += weight * part
            target[...] = total

        pieces(merge, out, *deltas)


MEAN = Aggregator(
    "mean",
    "the weighted mean, as DiLoCo has it: for trusted workers (one bad result moves it "
    "anywhere); the only one that holds no copy per worker",
    Mean,
    streams=True,
)
