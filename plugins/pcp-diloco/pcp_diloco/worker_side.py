"""A DiLoCo round on a worker: H inner steps from the global params, return the change.

In an overlapped round (`--overlap delayed`, `pcp_core.worker.overlap`) the shepherd's
new global parameters arrive while the steps run; their move is added to the parameters
and to the start between two calls, which leaves the change (start − end) as it is.

The inner optimizer's state carries over from the worker's last round, but for the
tensors the shepherd names in `DilocoWorkerSettings.zero_at_round_start` (its momentum,
see `DilocoSettings.inner_momentum`)."""

import time

from pcp_core.backends import zero_opt_tensors
from pcp_core.wire.messages import Assignment, Tensor
from pcp_core.worker.session import RoundWork, WorkerSession
from pcp_diloco.settings import DilocoWorkerSettings


def worker_round(session: WorkerSession, assignment: Assignment) -> RoundWork:
    global_params = [t.array for t in assignment.tensors]
    executor = session.executor
    executor.set_params(global_params)
    told = DilocoWorkerSettings(**session.settings.plugins.get("diloco", {}))
    zeroed = set(told.zero_at_round_start)
    if zeroed:
        zero_opt_tensors(executor, zeroed)
    steps_per_call = session.settings.steps_per_call
    started = time.perf_counter()
    losses: list[float] = []
    for call in range(assignment.inner_steps // steps_per_call):
        losses.extend(float(v) for v in executor.run(*session.batches(assignment, call)))
        moved = session.global_moved()
        if moved is not None:  # an overlapped round: fold the new global parameters in
            executor.set_params([p + m for p, m in zip(executor.params(), moved, strict=True)])
            global_params = [g + m for g, m in zip(global_params, moved, strict=True)]
    local_params = executor.params()
    compute_s = time.perf_counter() - started
    pseudo_gradient = [
        Tensor(spec.name, g - local)
        for spec, g, local in zip(executor.param_specs, global_params, local_params, strict=True)
    ]
    return RoundWork(losses, compute_s, pseudo_gradient)
