"""PCP's own model, dataset, algorithm and metrics writer, registered as plugins are.

Each hook imports what it registers when it is called, not at the top: plugin
discovery runs on every `pcp` start, and `pcp --help` must not pay for the model.
"""

from pcp_core.hookspecs import hookimpl


@hookimpl
def pcp_register_models(register) -> None:
    from pcp_core.program.nanogpt import MODEL

    register(MODEL)


@hookimpl
def pcp_register_datasets(register) -> None:
    from pcp_core.data.text import CHAR_TEXT

    register(CHAR_TEXT)


@hookimpl
def pcp_register_algorithms(register) -> None:
    from pcp_core.run.local import LOCAL

    register(LOCAL)


@hookimpl
def pcp_register_metric_sinks(register) -> None:
    from pcp_core.watch.metrics import JSONL

    register(JSONL)
