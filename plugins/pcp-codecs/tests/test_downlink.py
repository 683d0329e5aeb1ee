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
        outgoing = shepherd.outgoing(params, fragment, changes_wanted=any(current))
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


def test_whole_copy_when_no_worker_holds_the_current_one() -> None:
    shepherd = Downlink(NAMES, plugins.host().codec("int8"))
    params = [np.ones(shape, np.float32) for shape in SHAPES]
    shepherd.outgoing(params, (0,), changes_wanted=True)
    params[0] = params[0] * 3
    outgoing = shepherd.outgoing(params, (0,), changes_wanted=False)  # a retried round
    assert outgoing.changes == {}
    assert [t.array.tobytes() for t in outgoing.whole] == [p.tobytes() for p in params]


def test_a_change_for_a_worker_without_the_copy_is_refused() -> None:
    change = Tensor("wte", np.zeros(10, np.uint8))
    with pytest.raises(TransportError, match="without it"):
        HeldParameters(plugins.host().codec("int8")).take([change])
