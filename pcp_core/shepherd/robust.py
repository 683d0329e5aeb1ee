"""The robust aggregators PCP ships (`pcp_core.aggregators` says what one is).

- `centered-clip` (Karimireddy, He, Jaggi 2021): from a centre v, the last round's result,
  each pseudo-gradient counts as v + clip(x - v, τ), three times over, v moving each time;
  τ is CLIP_FACTOR times the lower median of the distances |x - v|, which a minority cannot
  raise past an honest worker's. One result moves the merge by at most τ / M.
- `trimmed-mean` (Yin et al. 2018): per coordinate, the TRIM share of the highest and of
  the lowest values left out, the weighted mean of the rest.
- `median` (Yin et al. 2018): per coordinate, the weighted median (the lower one).
- `geometric-median` (RFA, Pillutla, Kakade, Harchaoui 2022): the point whose summed
  distance to the results is least, by smoothed Weiszfeld iterations.

Sums run in float64 piece by piece (`pcp_core.parallel`), over the results in the order
given, so the same round gives the same bits on every run.
"""

from collections.abc import Iterable, Sequence

import numpy as np

from pcp_core.aggregators import Aggregator, Delta, Stateless
from pcp_core.parallel import pieces

CLIP_FACTOR = 2.0  # τ over the lower median of the distances to the centre
CLIP_ITERATIONS = 3
TRIM = 0.25  # the share of values left out at each end, per coordinate
WEISZFELD_ITERATIONS = 8
WEISZFELD_FLOOR = 1e-8  # relative: distances below this times the scale count as it


def lower_median(values: Iterable[float]) -> float:
    """The ⌈n/2⌉-th smallest: at most n/2 values above an honest majority's cannot move
    it past the largest honest one."""
    ordered = sorted(values)
    return float(ordered[(len(ordered) - 1) // 2])


def distances(center: Delta, deltas: Sequence[Delta]) -> np.ndarray:
    """|x - center| for each delta, in float64."""

    def squares(base: np.ndarray, *parts: np.ndarray) -> np.ndarray:
        wide = base.astype(np.float64)
        return np.array([np.sum(np.square(part - wide)) for part in parts])

    found = pieces(squares, center, *deltas)
    return np.sqrt(np.sum(found, axis=0)) if found else np.zeros(len(deltas))


def combination(coefficients: Sequence[float], arrays: Sequence[Delta], out: Delta) -> None:
    """out = Σ coefficients[j] · arrays[j], in float64; `out` may be one of `arrays`."""

    def merge(target: np.ndarray, *parts: np.ndarray) -> None:
        total = np.zeros(target.shape, np.float64)
        for coefficient, part in zip(coefficients, parts, strict=True):
            if coefficient:
                total += coefficient * part.astype(np.float64)
        target[...] = total

    pieces(merge, out, *arrays)


class CenteredClip:
    """Centered clipping around the last round's result of the same key."""

    def __init__(self) -> None:
        self.centers: dict[int, Delta] = {}

    def combine(
        self, key: int, deltas: Sequence[Delta], weights: Sequence[float], out: Delta
    ) -> list[float]:
        if len(deltas) == 1:  # within τ of the centre by construction: counted whole
            combination([1.0], deltas, out)
            return [1.0]
        center = self.centers.get(key)
        if center is None or [c.shape for c in center] != [d.shape for d in deltas[0]]:
            center = [np.zeros(d.shape, np.float32) for d in deltas[0]]
        share = np.asarray(weights, np.float64) / float(np.sum(weights))
        tau = CLIP_FACTOR * lower_median(distances(center, deltas))
        for target, source in zip(out, center, strict=True):
            target[...] = source
        counted = np.ones(len(deltas))
        for iteration in range(CLIP_ITERATIONS):
            counted = np.minimum(1.0, tau / np.maximum(distances(out, deltas), 1e-30))
            if iteration and (counted == 1).all():
                break  # `out` is the plain weighted mean, and no result is clipped: it stays
            kept = share * counted
            combination([1.0 - float(np.sum(kept)), *kept], [out, *deltas], out)
        return [float(c) for c in counted]

    def accept(self, key: int, merged: Delta) -> None:
        self.centers[key] = [np.array(array, np.float32) for array in merged]

    def state(self) -> dict[str, np.ndarray]:
        return {
            f"center.{key}.{i}": array
            for key, center in self.centers.items()
            for i, array in enumerate(center)
        }

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        centers: dict[int, dict[int, np.ndarray]] = {}
        for name, array in state.items():
            _, key, index = name.split(".")
            centers.setdefault(int(key), {})[int(index)] = np.array(array, np.float32)
        self.centers = {
            key: [parts[i] for i in range(len(parts))] for key, parts in centers.items()
        }


class TrimmedMean(Stateless):
    """Per coordinate, the weighted mean of the values left after trimming both ends."""

    def combine(
        self, key: int, deltas: Sequence[Delta], weights: Sequence[float], out: Delta
    ) -> None:
        trimmed = int(TRIM * len(deltas))
        column = np.asarray(weights, np.float64)[:, None]

        def merge(target: np.ndarray, *parts: np.ndarray) -> None:
            stacked = np.stack(parts)
            order = np.argsort(stacked, axis=0, kind="stable")
            kept = order[trimmed : len(parts) - trimmed]
            values = np.take_along_axis(stacked, kept, axis=0).astype(np.float64)
            weight = np.take_along_axis(np.broadcast_to(column, stacked.shape), kept, axis=0)
            target[...] = np.sum(values * weight, axis=0) / np.sum(weight, axis=0)

        pieces(merge, out, *deltas)


class Median(Stateless):
    """Per coordinate, the value where the sorted weights reach half their sum."""

    def combine(
        self, key: int, deltas: Sequence[Delta], weights: Sequence[float], out: Delta
    ) -> None:
        column = np.asarray(weights, np.float64)[:, None]
        half = float(np.sum(weights)) / 2

        def merge(target: np.ndarray, *parts: np.ndarray) -> None:
            stacked = np.stack(parts)
            order = np.argsort(stacked, axis=0, kind="stable")
            weight = np.take_along_axis(np.broadcast_to(column, stacked.shape), order, axis=0)
            first = np.argmax(np.cumsum(weight, axis=0) >= half, axis=0)
            chosen = np.take_along_axis(order, first[None], axis=0)
            target[...] = np.take_along_axis(stacked, chosen, axis=0)[0]

        pieces(merge, out, *deltas)


class GeometricMedian(Stateless):
    """Weiszfeld's iterations from the weighted mean, distances floored (smoothed)."""

    def combine(
        self, key: int, deltas: Sequence[Delta], weights: Sequence[float], out: Delta
    ) -> None:
        weight = np.asarray(weights, np.float64)
        combination(list(weight / np.sum(weight)), deltas, out)  # from the weighted mean
        scale = max(float(np.max(distances([np.zeros_like(d) for d in out], deltas))), 1e-30)
        for _ in range(WEISZFELD_ITERATIONS):
            beta = weight / np.maximum(distances(out, deltas), WEISZFELD_FLOOR * scale)
            combination(list(beta / np.sum(beta)), deltas, out)


CENTERED_CLIP = Aggregator(
    "centered-clip",
    "centered clipping around the last round's result (Karimireddy et al. 2021): each "
    "result moves the merge by at most a clip radius set by the honest majority",
    CenteredClip,
)
TRIMMED_MEAN = Aggregator(
    "trimmed-mean",
    f"per coordinate, the weighted mean without the top and bottom {TRIM:.0%} (Yin et al. 2018)",
    TrimmedMean,
)
MEDIAN = Aggregator("median", "per coordinate, the weighted median (Yin et al. 2018)", Median)
GEOMETRIC_MEDIAN = Aggregator(
    "geometric-median",
    "the geometric median by smoothed Weiszfeld iterations (RFA, Pillutla et al. 2022)",
    GeometricMedian,
)
