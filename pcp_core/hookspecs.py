"""The extension points of PCP.

Every hook receives a `register` callable instead of returning values, so one
package may register several things and the core can attribute each one to the
distribution that registered it.
"""

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT = "pcp"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[[Any], None]


@hookspec
def pcp_register_backends(register: Register) -> None:
    """Register `pcp_core.backends.Backend` objects (IREE target + runtime driver)."""


@hookspec
def pcp_register_optimizers(register: Register) -> None:
    """Register `InnerOptimizer` (compiled into the program) or `OuterOptimizer` objects."""


@hookspec
def pcp_register_transports(register: Register) -> None:
    """Register `pcp_core.wire.transport.Transport` objects."""


@hookspec
def pcp_register_algorithms(register: Register) -> None:
    """Register `pcp_core.algorithms.Algorithm` objects (how a run is driven)."""


@hookspec
def pcp_register_models(register: Register) -> None:
    """Register `pcp_core.models.Model` objects (JAX init and loss functions)."""


@hookspec
def pcp_register_datasets(register: Register) -> None:
    """Register `pcp_core.data.text.DatasetSource` objects."""


@hookspec
def pcp_register_metric_sinks(register: Register) -> None:
    """Register `pcp_core.watch.metrics.MetricSink` objects: each run hands them every record."""


@hookspec
def pcp_register_commands(app: Any) -> None:
    """Add typer sub-commands or sub-apps to the `pcp` command-line app."""
