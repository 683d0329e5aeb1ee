"""The state a spot check asks for (pcp_core.worker.audits): its digest binds every byte, name,
dtype and shape, and a state that is not the program's is refused."""

import numpy as np
import pytest

from pcp_core.shepherd.spot_checks import relative_difference
from pcp_core.wire.messages import Tensor
from pcp_core.worker.audits import RESIDUAL_PREFIX, RoundStart

OPT_SPECS = [("m", (2, 3), "float32"), ("step", (), "int32")]
PARAM_SPECS = [("w", (2, 3), "float32"), ("b", (3,), "float32")]
NAMES = [name for name, _, _ in OPT_SPECS]


def start() -> RoundStart:
    m = np.arange(6, dtype=np.float32).reshape(2, 3)
    return RoundStart([m, np.array(7, np.int32)], {"b": np.ones(3, np.float32)})


def test_the_state_crosses_as_tensors_and_keeps_its_digest() -> None:
    sent = start()
    received = RoundStart.from_tensors(sent.tensors(NAMES), OPT_SPECS, PARAM_SPECS)
    assert received.digest(NAMES) == sent.digest(NAMES)
    assert [t.name for t in sent.tensors(NAMES)] == ["m", "step", RESIDUAL_PREFIX + "b"]


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.opt_state[0].__setitem__((0, 0), np.float32(1e-30)),  # one value
        lambda s: s.residuals.pop("b"),  # a residual left out
        lambda s: s.residuals.__setitem__("w", np.zeros((2, 3), np.float32)),  # one more
        lambda s: s.opt_state.__setitem__(1, np.array(7, np.int64)),  # another dtype
    ],
)
def test_any_change_changes_the_digest(change) -> None:
    changed = start()
    change(changed)
    assert changed.digest(NAMES) != start().digest(NAMES)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ([Tensor("step", np.array(7, np.int32))], "m is missing"),
        (
            [Tensor("m", np.zeros((3, 2), np.float32)), Tensor("step", np.array(7, np.int32))],
            "m is missing or not float32 (2, 3)",
        ),
        (
            [*start().tensors(NAMES), Tensor(RESIDUAL_PREFIX + "x", np.zeros(1, np.float32))],
            "unknown tensors",
        ),
        ([*start().tensors(NAMES), Tensor("m", np.zeros((2, 3), np.float32))], "twice"),
    ],
)
def test_a_state_that_is_not_the_programs_is_refused(tensors, message) -> None:
    with pytest.raises(ValueError, match="audited state") as raised:
        RoundStart.from_tensors(tensors, OPT_SPECS, PARAM_SPECS)
    assert message in str(raised.value)


def test_relative_difference() -> None:
    want = [np.ones(4, np.float32)]
    assert relative_difference([np.ones(4, np.float32)], want) == 0.0
    assert relative_difference([np.full(4, 1.5, np.float32)], want) == pytest.approx(0.5)
    assert relative_difference([np.full(4, np.nan, np.float32)], want) != 0.0
