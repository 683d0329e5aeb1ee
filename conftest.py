"""Repository-wide pytest settings: under CI, a skip is a failure unless CI cannot help it.

CI has no accelerator, so the run-time tests of the CUDA, ROCm and Metal backends
skip there with their reason. Any other skip (a missing test dependency such as torch,
no Vulkan loader or lavapipe, a missing data file) means the set-up is broken, and CI
must say so rather than pass.
"""

import os

import pytest

SKIPS_CI_CANNOT_HELP = ("no cuda device here", "no rocm device here", "no metal device here")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if not os.environ.get("CI") or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if not any(allowed in reason for allowed in SKIPS_CI_CANNOT_HELP):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, which must have what this test needs: {reason}"
