"""PCP's pytest plugin, loaded by pytest wherever pcp-core is installed (`pytest11`).

It makes a plugin's tests strict and quick without any set-up in the plugin package:
- `PCP_STRICT_PLUGINS=1` unless set: a plugin that fails to load fails the tests
  instead of becoming a line in `pcp plugins`;
- one compile cache per test session (`PCP_CACHE_DIR`, unless set), so the suites
  compile each reference program once;
- `PCP_LOG_FORMAT=console` unless set: the `pcp` processes a test starts write their logs
  as `key=value` lines (not the JSON lines they write to a pipe), for tests to read;
- Ctrl-C reaches the processes a test starts: a shell that starts pytest in the
  background without job control ignores SIGINT, children inherit that, and a `pcp`
  process a test presses Ctrl-C on would rightly ignore it too, so it is caught here
  and children start with the default again;
- the `pcp_host` fixture: the loaded plugin host (`pcp_host.optimizer("mine")`).

The conformance suites are base classes: `from pcp_core.testing import
OptimizerConformance` and subclass it with your plugin's name (docs/plugins.md).
"""

import os
import signal
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("PCP_STRICT_PLUGINS", "1")
    os.environ.setdefault("PCP_LOG_FORMAT", "console")
    if "PCP_CACHE_DIR" not in os.environ:
        factory = pytest.TempPathFactory.from_config(config, _ispytest=True)
        os.environ["PCP_CACHE_DIR"] = str(factory.mktemp("pcp-compile-cache"))
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line("markers", "slow: long end-to-end tests (deselect: -m 'not slow')")


@pytest.fixture
def pcp_host() -> Any:
    from pcp_core import plugins

    return plugins.host()
