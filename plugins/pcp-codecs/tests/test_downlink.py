"""Global parameters through a lossy codec (pcp_core.wire.downlink): every worker's copy
equals the shepherd's bit for bit after many rounds, and stays near its parameters."""

import numpy as np
import pytest

from pcp_core import plugins
from pcp_core.wire.downlink import Downlink, HeldParameters
from pcp_core.wire.messages import Tensor
from pcp_core.wire.transport import TransportError

NAMES = ["wte", "h0.attn", "h0.mlp", "ln_f"]
SHAPES = [(50, 16), (16, 48), (16, 64), (16,)]


@pytest.mark.parametrize("name", ["bf16", "int8", "fp4", "topk"])
def test_copies_stay_equal_bit_for_bit_over_many_rounds(name: str) -> None:
    codec = plugins.host().codec(name)
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]
    shepherd = Downlink(NAMES, codec)
    workers = [HeldParameters(codec) for _ in range(3)]
    current = [False] * 3
    for round_index in range(300):
        fragment = (round_index % 2, 2 + round_index % 2)  # two fragments, alternating
        for i in fragment:  # the outer step moves the fragment the last round returned
            params[i] = params[i] - 0.01 * rng.standard_normal(params[i].shape).astype(np.float32)
        outgoing = shepherd.outgoing(params, fragment)
        for w, worker in enumerate(workers):
            if current[w] and outgoing.changes:
                received = worker.take([outgoing.changes[i] for i in fragment])
                assert all(t.array.dtype == np.float32 for t in received)
            else:
                worker.take(outgoing.whole)
            # a worker sometimes misses a round (refused, cut off): whole copy next time
            current[w] = rng.random() > 0.1
        for worker in workers:
            for i, held in enumerate(shepherd.held):
                assert worker.held[NAMES[i]].tobytes() == held.tobytes()
    # what one change leaves out is in the next: the copy tracks the parameters
    for held, value in zip(shepherd.held, params, strict=True):
        scale = float(np.abs(value).max())
        assert float(np.abs(held - value).max()) < (0.5 if name == "topk" else 0.2) * scale


def test_a_worker_without_the_last_copy_gets_the_copy_the_others_hold() -> None:
    """A retried round, a rejoin: the whole copy is the others' copy after this round's
    change, not the shepherd's parameters, so every worker starts from the same values."""
    codec = plugins.host().codec("int8")
    shepherd, current, rejoined = (
        Downlink(NAMES, codec),
        HeldParameters(codec),
        HeldParameters(codec),
    )
    params = [
        np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape) for shape in SHAPES
    ]
    current.take(shepherd.outgoing(params, (0, 1, 2, 3)).whole)
    params[0] = params[0] * 3.1
    outgoing = shepherd.outgoing(params, (0,))
    current.take([outgoing.changes[0]])
    rejoined.take(outgoing.whole)
    assert {n: a.tobytes() for n, a in rejoined.held.items()} == {
        n: a.tobytes() for n, a in current.held.items()
    }
    assert rejoined.held["wte"].tobytes() != params[0].tobytes()  # int8 left something out


def test_a_checkpointed_copy_goes_on_as_the_uninterrupted_one() -> None:
    """`state` saved and `load_state` into a new Downlink (a resumed shepherd): the next
    round's changes and copy are the same bytes as the uninterrupted run's."""
    codec = plugins.host().codec("fp4")
    rng = np.random.default_rng(1)
    params = [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]
    running = Downlink(NAMES, codec)
    for _ in range(3):
        running.outgoing(params, (0, 1, 2, 3))
        params = [p - 0.01 * rng.standard_normal(p.shape).astype(np.float32) for p in params]
    resumed = Downlink(NAMES, codec)
    resumed.load_state(running.state())
    going_on, after_resume = running.outgoing(params, (0, 1)), resumed.outgoing(params, (0, 1))
    assert [t.array.tobytes() for t in going_on.changes.values()] == [
        t.array.tobytes() for t in after_resume.changes.values()
    ]
    assert [t.array.tobytes() for t in going_on.whole] == [
        t.array.tobytes() for t in after_resume.whole
    ]
    assert Downlink(NAMES, None).state() == {}  # float32 values: nothing to keep


def test_a_change_for_a_worker_without_the_copy_is_refused() -> None:
    change = Tensor("wte", np.zeros(10, np.uint8))
    with pytest.raises(TransportError, match="without it"):
        HeldParameters(plugins.host().codec("int8")).take([change])
