"""The last line of defence for the global parameters: judge each outer step before it
is kept, and roll back to the state before it when it is implausible.

The result checks (`pcp_core.shepherd.aggregation`) refuse a pseudo-gradient whose norm is far
above the others', but they need a few reference norms to tell who the outlier is: in a
first round with two workers, a worker holding the secret could still send one of any
size. So the shepherd also judges what the outer step did to the parameters:

- every parameter finite;
- the step's norm at most STEP_RATIO times the median of the last STEP_HISTORY accepted
  steps, or, before there are any, at most FIRST_STEP_RATIO times the parameters' own
  norm (an honest first round moves the tiny model by about 1x its norm, GPT-2 small by
  less; a 1e30 payload by 1e29x).

A step that fails is undone (`restore`): the parameters and the outer optimizer's state
go back to the copies taken before it (`keep`), which costs one more copy of each. The
shepherd then names the results that caused it (`outliers`) and runs the round again
without them; when no result stands out, the run itself diverged and stops.
"""

import math
import statistics
from collections import deque
from collections.abc import Mapping

import numpy as np

from pcp_core.optimizers import OuterStep
from pcp_core.parallel import all_finite, delta_norm, difference_norm, pieces

STEP_RATIO = 10.0
FIRST_STEP_RATIO = 100.0
STEP_HISTORY = 5


class StepGuard:
    """A copy of the state before the latest outer step, and the norms of earlier steps."""

    def __init__(self, params: list[np.ndarray]) -> None:
        self._params = [np.empty_like(p) for p in params]
        self._outer: dict[str, np.ndarray] = {}
        self._steps: deque[float] = deque(maxlen=STEP_HISTORY)

    def keep(self, params: list[np.ndarray], outer_state: Mapping[str, np.ndarray]) -> None:
        """Copy the state an outer step is about to change."""
        for name, array in outer_state.items():
            kept = self._outer.get(name)
            if kept is None or kept.shape != array.shape or kept.dtype != array.dtype:
                self._outer[name] = np.empty_like(array, order="C")
        self._outer = {name: self._outer[name] for name in outer_state}
        names = list(outer_state)
        sources = [*params, *(np.ascontiguousarray(outer_state[n]) for n in names)]
        pieces(np.copyto, [*self._params, *(self._outer[n] for n in names)], sources)

    def judge(self, params: list[np.ndarray], reference: bool = True) -> str | None:
        """Why the step from the kept parameters to `params` is implausible, or None (and
        then its norm joins the history, unless it is no `reference` for later steps:
        a streaming fragment's first, which covers fewer inner steps than the rest)."""
        if not all_finite(params):
            return "the outer step made the global parameters non-finite"
        step = difference_norm(params, self._params)
        if self._steps:
            limit = STEP_RATIO * statistics.median(self._steps)
            what = f"{STEP_RATIO:g}x the median of the last steps ({limit / STEP_RATIO:.4g})"
        else:
            scale = max(delta_norm(self._params), 1.0)
            limit = FIRST_STEP_RATIO * scale
            what = f"{FIRST_STEP_RATIO:g}x the parameters' norm ({scale:.4g})"
        if not math.isfinite(step) or step > limit:
            return f"the outer step's norm {step:.4g} is over {what}"
        if reference:
            self._steps.append(step)
        return None

    def restore(self, params: list[np.ndarray], outer_step: OuterStep) -> None:
        """Put the kept parameters and outer optimizer state back."""
        pieces(np.copyto, params, self._params)
        outer_step.load_state(self._outer)


def outliers(norms: Mapping[str, float]) -> list[str]:
    """The senders whose pseudo-gradient norm is over STEP_RATIO times the median of the
    others' (with one sender: none, there is no telling)."""
    found = []
    for name, norm in norms.items():
        others = [n for other, n in norms.items() if other != name]
        if others and norm > STEP_RATIO * statistics.median(others):
            found.append(name)
    return sorted(found)
