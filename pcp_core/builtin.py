"""PCP's own model, dataset, algorithm and metrics writer, registered as plugins are."""

from pcp_core.hookspecs import hookimpl


@hookimpl
def pcp_register_models(register) -> None:
    from pcp_core.nanogpt import MODEL

    register(MODEL)


@hookimpl
def pcp_register_datasets(register) -> None:
    from pcp_core.data import CHAR_TEXT

    register(CHAR_TEXT)


@hookimpl
def pcp_register_algorithms(register) -> None:
    from pcp_core.local import LOCAL

    register(LOCAL)


@hookimpl
def pcp_register_metric_sinks(register) -> None:
    from pcp_core.metrics import JSONL

    register(JSONL)
