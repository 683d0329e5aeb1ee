"""What the fuzz tests of network decoders share (plugins' tests/test_fuzz.py files):

- `FUZZ`, hypothesis settings: PCP_FUZZ_EXAMPLES examples a test (300 unless set), the
  same inputs on every run so CI is repeatable, no deadline, no example database;
- `TRIED`, the inputs each test handed to its decoder, and `report_tried`, an autouse
  fixture a test module imports that writes them as JSON to $PCP_FUZZ_REPORT when the
  module's tests end (benchmarks/fuzz.py reads it);
- for codecs' decoders: `decode_checked`, a decode held to the codec contract's limits,
  and `mutated`, an encoding with bytes flipped, cut and inserted.
"""

import json
import os
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from pcp_core.codecs import Codec, CodecError, decode_tensor

EXAMPLES = int(os.environ.get("PCP_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same inputs on every run, so CI is repeatable
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TRIED: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def report_tried() -> Iterator[None]:
    """Writes TRIED as JSON to $PCP_FUZZ_REPORT, if set, once the module's tests are done."""
    yield
    if path := os.environ.get("PCP_FUZZ_REPORT"):
        Path(path).write_text(json.dumps(dict(sorted(TRIED.items())), indent=2) + "\n")


HANG_S = 5.0  # decoding a few thousand values this long is a hang, even on a loaded machine
ALLOCATION_SLACK = 64 * 2**10  # Python objects besides the arrays


def decode_checked(codec: Codec, data: bytes, count: int, test: str) -> None:
    """Decode bytes from the network as a codec must: whatever they are, `count` float32
    values or a CodecError (no other exception), within HANG_S, allocating no more than
    16 bytes a value plus 4 a byte given (plus ALLOCATION_SLACK); counted in TRIED[test]."""
    TRIED[test] += 1
    tracemalloc.start()
    started = time.monotonic()
    try:
        values = decode_tensor(codec, data, (count,))
    except CodecError:
        values = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.monotonic() - started < HANG_S
    assert peak <= 16 * count + 4 * len(data) + ALLOCATION_SLACK, (count, len(data), peak)
    if values is not None:
        assert values.dtype == np.float32 and values.shape == (count,)


def mutated(encoded: bytes, data: st.DataObject) -> bytes:
    """`encoded` with one to eight bytes flipped, the rest cut off, or bytes inserted."""
    changed = bytearray(encoded)
    for _ in range(data.draw(st.integers(1, 8))):
        where = data.draw(st.integers(0, len(changed)))
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip" and where < len(changed):
            changed[where] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del changed[where:]
        else:
            changed[where:where] = data.draw(st.binary(min_size=1, max_size=16))
    return bytes(changed)
