"""A pytest plugin: the xla backend's tests with other XLA compiler options for CUDA.

    PCP_XLA_CUDA_OPTIONS='{"xla_gpu_enable_triton_gemm": false}' \\
        python -m pytest -p pytest_xla_options plugins/pcp-xla/tests   # benchmarks/ on PYTHONPATH

`PCP_XLA_CUDA_OPTIONS` (JSON) replaces `pcp_xla.executor.COMPILER_OPTIONS["cuda"]`, so an
option is tested on the GPU before it becomes the default.
"""

import json
import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    from pcp_xla import executor

    if "PCP_XLA_CUDA_OPTIONS" in os.environ:
        options = json.loads(os.environ["PCP_XLA_CUDA_OPTIONS"])
        executor.COMPILER_OPTIONS = {**executor.COMPILER_OPTIONS, "cuda": options}


def pytest_report_header(config: pytest.Config) -> str:
    from pcp_xla import executor

    return f"xla compiler options: {executor.COMPILER_OPTIONS}"
