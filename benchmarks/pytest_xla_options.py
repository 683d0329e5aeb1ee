"""A pytest plugin: the xla backend's tests with other per-platform choices for CUDA.

    PCP_XLA_CUDA_OPTIONS='{"xla_allow_excess_precision": false}' PCP_BF16_HIDDEN=1 \\
        python -m pytest -p pytest_xla_options plugins/pcp-xla/tests   # benchmarks/ on PYTHONPATH

`PCP_XLA_CUDA_OPTIONS` (JSON) replaces `pcp_xla.runtime.COMPILER_OPTIONS["cuda"]`;
`PCP_BF16_HIDDEN` (0 or 1) sets `pcp_core.program.precision.BF16_HIDDEN_PLATFORMS`.
So a choice is tested on the GPU before it becomes the default.
"""

import json
import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    from pcp_xla import runtime

    from pcp_core.program import precision

    if "PCP_XLA_CUDA_OPTIONS" in os.environ:
        options = json.loads(os.environ["PCP_XLA_CUDA_OPTIONS"])
        runtime.COMPILER_OPTIONS = {**runtime.COMPILER_OPTIONS, "cuda": options}
    if "PCP_BF16_HIDDEN" in os.environ:
        hidden = os.environ["PCP_BF16_HIDDEN"] == "1"
        precision.BF16_HIDDEN_PLATFORMS = ("cuda",) if hidden else ()


def pytest_report_header(config: pytest.Config) -> str:
    from pcp_xla import runtime

    from pcp_core.program import precision

    return (
        f"xla compiler options: {runtime.COMPILER_OPTIONS}; "
        f"bf16 hidden on: {precision.BF16_HIDDEN_PLATFORMS}"
    )
