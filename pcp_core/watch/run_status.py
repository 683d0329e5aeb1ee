"""What a run is doing right now: the one state the dashboard, `/status`, `/metrics` and
the log lines are all drawn from.

The algorithm and the shepherd's threads (admission, rounds) report into a `RunStatus`;
readers take a `snapshot()`, a plain JSON-able dict made under the lock, so a reader
never holds up training for longer than a copy. Every change of a worker's or the run's
state is also one structured log event, with the worker and the round bound in.
`RunStatus` is also the run's `Progress` (start, update), so algorithms need nothing new.
While a dashboard shows the run, progress lines stop and the states a worker goes through
in every round (training, reporting, ready) are logged at debug level only.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import structlog

log = structlog.get_logger(__name__)

# A worker's life, in the order it usually goes: joined (authenticating), its program
# being compiled and loaded, waiting for a round, training its inner steps, its result
# being reported and fetched; dead once its connection is gone, restarting when a worker
# that had an index comes back for it, quarantined when the shepherd turned it away for
# its strikes (pcp_core.shepherd.accountability).
WORKER_STATES = (
    "joining",
    "restarting",
    "compiling",
    "ready",
    "training",
    "reporting",
    "dead",
    "quarantined",
)
HISTORY = 2000  # loss points kept for the chart and /status (older ones are thinned)
PROGRESS_LOG_S = 5.0  # without a dashboard, at most one progress line this often
# a distributed round's record keys the status keeps for its last round
LAST_ROUND_KEYS = (
    "bytes_sent",
    "bytes_received",
    "compute_s",
    "communication_s",
    "compute_utilisation",
    "pseudo_gradient_bytes",  # as they crossed the link (encoded, --codec)
    "pseudo_gradient_raw_bytes",  # as float32
    "encode_s",
    "decode_s",
)


@dataclass
class WorkerStatus:
    index: int
    name: str
    backend: str
    arch: str
    address: str
    state: str
    since: float  # time.time() when it entered `state`
    round: int | None = None  # the round it is in (training, reporting) or last took part in
    inner_steps: int = 0  # the inner steps of its current round
    loss: float | None = None  # its last round's (or call's) loss
    steps_per_s: float | None = None
    tokens_per_s: float | None = None
    # its last counted round's seconds: inner steps, blocked waiting for the shepherd,
    # sending (pcp_core.worker.clock)
    compute_s: float | None = None
    wait_s: float | None = None
    send_s: float | None = None
    rounds: int = 0  # results of its that counted
    heard: Callable[[], float] | None = field(default=None, repr=False)  # time.time() of
    # the last message from it (heartbeats too); None: in-process

    def view(self, now: float) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "heard"}
        data["last_heard_s"] = None if self.heard is None else max(now - self.heard(), 0.0)
        data["inner_step"] = self.estimated_step(now)
        return data

    def estimated_step(self, now: float) -> int | None:
        """Its inner step in the current round, from the time since the round began and
        its speed in the last one (workers report only at the end of a round)."""
        if self.state != "training" or not self.steps_per_s:
            return None
        return min(int((now - self.since) * self.steps_per_s), self.inner_steps)


@dataclass
class LossPoint:
    tokens: int
    step: int
    loss: float
    val_loss: float | None = None
    worker_losses: dict[str, float] = field(default_factory=dict)


class RunStatus:
    """See the module docstring. Thread-safe; every method is cheap."""

    def __init__(self, log_progress: bool = True) -> None:
        self._lock = threading.Lock()
        self.log_progress = log_progress  # off while a dashboard shows the run
        self._run: dict[str, Any] = {
            "state": "starting",
            "since": time.time(),
            "started": time.time(),
            "description": "",
            "step": 0,
            "total_steps": 0,
            "round": None,
            "rounds": None,
            "tokens": 0,
            "tokens_per_s": None,
            "loss": None,
            "val_loss": None,
            "bytes_sent": 0,
            "bytes_received": 0,
            "last_round": None,  # bytes, compute and communication time of the last round
            "compute_utilisation": None,  # of the training phase so far (a distributed run)
            "training_started": None,
        }
        self._info: dict[str, Any] = {}
        self._workers: dict[int, WorkerStatus] = {}
        self._history: list[LossPoint] = []
        self._logged_progress = 0.0

    # -- the run ----------------------------------------------------------------------------

    def describe(self, **info: Any) -> None:
        """Facts about the run that do not change: algorithm, backend, model, parameters."""
        with self._lock:
            self._info.update(info)

    def set_state(self, state: str, quiet: bool = False, **fields: Any) -> None:
        """The run entered `state`; logged unless `quiet` (the caller says it otherwise)."""
        with self._lock:
            if self._run["state"] == state:
                return
            self._run["state"], self._run["since"] = state, time.time()
        if not quiet:
            log.info("run state", state=state, **fields)

    def start(self, total_steps: int, description: str) -> None:
        with self._lock:
            self._run.update(total_steps=total_steps, description=description)
            self._run["training_started"] = time.time()
        self.set_state("training")

    def update(self, step: int, **fields: float) -> None:
        now = time.time()
        with self._lock:
            self._run["step"] = step
            self._run.update({k: v for k, v in fields.items() if k in ("loss", "tokens_per_s")})
            total = self._run["total_steps"]
            due = self.log_progress and (
                now - self._logged_progress >= PROGRESS_LOG_S or step >= total
            )
            if due:
                self._logged_progress = now
            eta = self._eta(now)
        if due:
            log.info(
                "progress",
                step=step,
                of=total,
                **{k: round(v, 4) for k, v in fields.items()},
                **({"eta_s": round(eta)} if eta is not None else {}),
            )

    def _eta(self, now: float) -> float | None:
        run = self._run
        started, step, total = run["training_started"], run["step"], run["total_steps"]
        if not started or step <= 0 or not total:
            return None
        return (total - step) * (now - started) / step

    def record(self, record: dict[str, Any]) -> None:
        """A metrics record (see `pcp_core.watch.metrics.Metrics`): loss history, round figures."""
        with self._lock:
            run = self._run
            run["tokens"] = record.get("tokens", run["tokens"])
            if "round" in record:
                run["round"] = record["round"]
            if record.get("val_loss") is not None:
                run["val_loss"] = record["val_loss"]
            if "bytes_sent" in record:
                run["bytes_sent"] += record["bytes_sent"]
                run["bytes_received"] += record.get("bytes_received", 0)
                run["last_round"] = {key: record.get(key) for key in LAST_ROUND_KEYS}
                run["compute_utilisation"] = record.get("run_compute_utilisation")
            if record.get("loss") is not None:
                point = LossPoint(
                    record.get("tokens", 0),
                    record.get("step", 0),
                    record["loss"],
                    record.get("val_loss"),
                    dict(record.get("worker_losses", {})),
                )
                self._history.append(point)
                if len(self._history) > HISTORY:  # keep every other of the older half
                    half = len(self._history) // 2
                    self._history[:half] = self._history[:half:2]

    # -- workers ----------------------------------------------------------------------------

    def worker_joined(
        self,
        index: int,
        name: str,
        backend: str,
        arch: str,
        address: str,
        heard: Callable[[], float] | None = None,
        restarting: bool = False,
    ) -> None:
        """A worker got `index` (its row); `restarting`: it had that index before."""
        state = "restarting" if restarting else "joining"
        with self._lock:
            old = self._workers.get(index)
            worker = WorkerStatus(index, name, backend, arch, address, state, time.time())
            worker.heard = heard
            if old is not None:  # its history carries over to the worker that took it
                worker.loss, worker.rounds = old.loss, old.rounds
                worker.steps_per_s, worker.tokens_per_s = old.steps_per_s, old.tokens_per_s
            self._workers[index] = worker
        log.info("worker state", worker=index, name=name, state=state, address=address)

    def worker_state(self, index: int, state: str, round: int | None = None, **fields: Any) -> None:
        """Worker `index` entered `state` (one of WORKER_STATES); logged once per change."""
        with self._lock:
            worker = self._workers.get(index)
            if worker is None or (worker.state == state and worker.round == round):
                return
            worker.state, worker.since = state, time.time()
            if round is not None:
                worker.round = round
            if "inner_steps" in fields:
                worker.inner_steps = fields.pop("inner_steps")
            name = worker.name
        extra = {"round": round} if round is not None else {}
        in_round = round is not None and state in ("training", "reporting", "ready")
        say = log.debug if in_round and not self.log_progress else log.info
        say("worker state", worker=index, name=name, state=state, **extra, **fields)

    def worker_result(
        self,
        index: int,
        loss: float,
        steps: int,
        tokens: int,
        compute_s: float,
        wait_s: float | None = None,
        send_s: float | None = None,
    ) -> None:
        """Worker `index`'s result counted: its loss, speed and times over the round
        (waiting and sending: those its Result reported, for a distributed run)."""
        with self._lock:
            worker = self._workers.get(index)
            if worker is None:
                return
            worker.loss, worker.rounds = loss, worker.rounds + 1
            worker.compute_s, worker.wait_s, worker.send_s = compute_s, wait_s, send_s
            if compute_s > 0:
                worker.steps_per_s, worker.tokens_per_s = steps / compute_s, tokens / compute_s

    # -- readers ----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything above as plain data (JSON-able), consistent at one instant."""
        now = time.time()
        with self._lock:
            run = dict(self._run)
            run["elapsed_s"] = now - run["started"]
            run["eta_s"] = self._eta(now)
            workers = [w.view(now) for _, w in sorted(self._workers.items())]
            history = [asdict(p) for p in self._history]
            info = dict(self._info)
        counts = {state: 0 for state in WORKER_STATES}
        for worker in workers:
            counts[worker["state"]] += 1
        return {
            "time": now,
            "run": run | info,
            "workers": workers,
            "worker_states": counts,
            "history": history,
        }
