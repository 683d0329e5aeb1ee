"""The worker: join a shepherd, load the program it ships, train when asked.

The algorithm (named in the shepherd's Setup) decides what a round is; this module
runs the worker: the join (`pcp_core.worker.joining`: the handshake, the program and
data), heartbeats and the rounds, one at a time (`serve`) or with the next round
computing while the last one's result travels (`pcp_core.worker.overlap`, when the run
asks for it), both routing the shepherd's messages alike (`pcp_core.worker.reports`);
the inner optimizer state across rounds is `pcp_core.worker.session.InnerState`.

Losing the shepherd (silent past the timeout, or gone) ends the process with the
"crashed" exit code; its supervisor starts it again, and it rejoins.
"""

from typing import Any

import numpy as np
import structlog

from pcp_core.backends import device_indices
from pcp_core.codecs import CodecLookup
from pcp_core.program.build import SCHEDULE_TENSOR
from pcp_core.wire.liveness import LiveConnection
from pcp_core.wire.messages import Assignment
from pcp_core.worker.joining import WorkerOptions, join_shepherd, take_setup
from pcp_core.worker.overlap import OverlappedRounds
from pcp_core.worker.reports import Reports, dispatch
from pcp_core.worker.session import InnerState, WorkerRound, WorkerSession
from pcp_core.worker.state import InnerStateStore

log = structlog.get_logger(__name__)


def run_worker(options: WorkerOptions, plugins: Any) -> None:
    """Join, then serve rounds until the shepherd says stop."""
    backend = plugins.backend(options.backend)
    arch = backend.resolve_arch(options.target, device_indices(options.device)[0])
    backend.runtime.require_device(backend, options.device)  # fail early
    store = InnerStateStore(options.state_dir)
    welcome, conn = join_shepherd(options, plugins, backend, arch, store.previous_index())
    try:
        conn.start_heartbeats(welcome.heartbeat_s)
        log.info(
            "joined",
            shepherd=f"{options.host}:{options.port}",
            index=welcome.worker_index,
            arch=arch,
        )
        setup, executor, corpus, settings = take_setup(conn, options, backend, plugins)
        if options.on_joined is not None:
            options.on_joined()
        session = WorkerSession(welcome.worker_index, executor, corpus, settings)
        worker_round: WorkerRound = plugins.algorithm(settings.algorithm).worker_round
        schedule = {t.name: np.array(t.array) for t in setup.tensors if t.name == SCHEDULE_TENSOR}
        inner = InnerState(session, store, settings.run_id, from_setup=schedule)
        try:
            if settings.overlap:
                OverlappedRounds(conn, session, worker_round, inner, plugins).serve()
            else:
                serve(conn, session, worker_round, inner, plugins)
        finally:
            inner.saved()  # the last round's state on disk before the worker goes
    finally:
        conn.close()


def serve(
    conn: LiveConnection,
    session: WorkerSession,
    worker_round: WorkerRound,
    inner: InnerState,
    codecs: CodecLookup,
) -> None:
    """Rounds until Stop, one at a time: Assignment -> Result; then Fetch -> Delta, or
    Discard; in an audited run, Audit -> AuditState (`pcp_core.worker.reports`)."""
    reports = Reports(conn, inner, codecs)

    def assigned(message: Assignment) -> None:
        inner.prepare(message.round)
        reports.started(message)
        reports.report(message, worker_round(session, message))

    dispatch(reports.receive, assigned, reports.settle, reports.audit)
