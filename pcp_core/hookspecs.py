"""The extension points of PCP.

Every hook receives a `register` callable instead of returning values, so one
package may register several things and the core can attribute each one to the
distribution that registered it.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # types only: importing this module must stay instant
    import typer

    from pcp_core.aggregators import Aggregator
    from pcp_core.algorithms import Algorithm
    from pcp_core.backends import Backend
    from pcp_core.codecs import Codec
    from pcp_core.data.text import DatasetSource
    from pcp_core.launchers import Launcher
    from pcp_core.models import Model
    from pcp_core.optimizers import InnerOptimizer, OuterOptimizer
    from pcp_core.watch.metrics import MetricSink
    from pcp_core.wire.transport import Transport

PROJECT = "pcp"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def pcp_register_backends(register: "Callable[[Backend], None]") -> None:
    """Register `pcp_core.backends.Backend` objects (a runtime and its target)."""


@hookspec
def pcp_register_optimizers(
    register: "Callable[[InnerOptimizer | OuterOptimizer], None]",
) -> None:
    """Register `InnerOptimizer` (compiled into the program) or `OuterOptimizer` objects."""


@hookspec
def pcp_register_transports(register: "Callable[[Transport], None]") -> None:
    """Register `pcp_core.wire.transport.Transport` objects."""


@hookspec
def pcp_register_codecs(register: "Callable[[Codec], None]") -> None:
    """Register `pcp_core.codecs.Codec` objects (how tensors cross the link as bytes)."""


@hookspec
def pcp_register_aggregators(register: "Callable[[Aggregator], None]") -> None:
    """Register `pcp_core.aggregators.Aggregator` objects (how the shepherd merges a
    round's pseudo-gradients)."""


@hookspec
def pcp_register_algorithms(register: "Callable[[Algorithm], None]") -> None:
    """Register `pcp_core.algorithms.Algorithm` objects (how a run is driven)."""


@hookspec
def pcp_register_models(register: "Callable[[Model], None]") -> None:
    """Register `pcp_core.models.Model` objects (JAX init and loss functions)."""


@hookspec
def pcp_register_datasets(register: "Callable[[DatasetSource], None]") -> None:
    """Register `pcp_core.data.text.DatasetSource` objects."""


@hookspec
def pcp_register_metric_sinks(register: "Callable[[MetricSink], None]") -> None:
    """Register `pcp_core.watch.metrics.MetricSink` objects: each run hands them every record."""


@hookspec
def pcp_register_launchers(register: "Callable[[Launcher], None]") -> None:
    """Register `pcp_core.launchers.Launcher` objects (how `pcp launch` starts a run)."""


@hookspec
def pcp_register_commands(app: "typer.Typer") -> None:
    """Add typer sub-commands or sub-apps to the `pcp` command-line app."""
