"""Streaming fragments (`--fragments P`, Douillard et al., 2025): the parameters split
into P groups of whole tensors, each synchronised on its own schedule.

A run of P fragments has rounds of H/P inner steps, and round r synchronises fragment
r mod P alone: its pseudo-gradient is all a worker sends, and the new global values of
the fragment the last round synchronised are all the shepherd sends back to a worker
that took part in it. Each fragment is thus synchronised every H steps, as in DiLoCo
with H inner steps, but the transfers are spread over the H steps in P pieces: a round
moves 1/P of the model each way, and with overlapped rounds a fold comes P times sooner
after the synchronisation it answers (fewer stale steps, `pcp_core.worker.overlap`).

Both sides compute the split from the parameter specs, so nothing about it travels.
"""

from collections.abc import Sequence


def split(sizes: Sequence[int], count: int) -> list[tuple[int, ...]]:
    """`count` groups of tensor indices, balanced by element count: each tensor, the
    largest first (ties by index), goes to the lightest group so far (the lowest index
    among equals). A tensor is never cut, so a group holding one that is larger than
    1/count of the model is larger than the others."""
    if not 1 <= count <= len(sizes):
        raise ValueError(
            f"fragments must be from 1 to the model's {len(sizes)} parameter tensors, got {count}"
        )
    groups: list[list[int]] = [[] for _ in range(count)]
    weights = [0] * count
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        lightest = min(range(count), key=lambda g: (weights[g], g))
        groups[lightest].append(index)
        weights[lightest] += sizes[index]
    return [tuple(sorted(group)) for group in groups]


def of_round(round_index: int, count: int) -> int:
    """The fragment round `round_index` synchronises."""
    return round_index % count
