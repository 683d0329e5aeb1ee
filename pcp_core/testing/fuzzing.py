"""What the fuzz tests of network decoders share (plugins' tests/test_fuzz.py files):

- `FUZZ`, hypothesis settings: PCP_FUZZ_EXAMPLES examples a test (300 unless set), the
  same inputs on every run so CI is repeatable, no deadline, no example database;
- `TRIED`, the inputs each test handed to its decoder, and `report_tried`, an autouse
  fixture a test module imports that writes them as JSON to $PCP_FUZZ_REPORT when the
  module's tests end (benchmarks/fuzz.py reads it).
"""

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

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
