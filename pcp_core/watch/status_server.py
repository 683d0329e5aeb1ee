"""The status endpoint of a running shepherd (`--status-port`): plain HTTP on a thread.

- `/healthz`: `ok` while the run is alive (200), or its end state once it failed (503);
- `/status`: `RunStatus.snapshot()` as JSON, what the dashboard shows;
- `/metrics`: the same figures in Prometheus's text exposition format (version 0.0.4).

It binds to localhost unless told otherwise (`--status-host`): it needs no secret, so
it says nothing that the run's own logs do not, and accepts nothing but GET.
"""

import contextlib
import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog

from pcp_core.config import ConfigError
from pcp_core.watch.metrics import finite_json
from pcp_core.watch.run_status import RunStatus

log = structlog.get_logger(__name__)

PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNHEALTHY = ("failed",)


@contextlib.contextmanager
def serving(status: RunStatus, host: str, port: int | None) -> Iterator[tuple[str, int] | None]:
    """Serve `status` on host:port for the duration of the block; None port: no server."""
    if port is None:
        yield None
        return
    try:
        server = ThreadingHTTPServer((host, port), _handler(status))
    except OSError as error:
        why = error.strerror or str(error)
        raise ConfigError(f"cannot serve the status endpoint on {host}:{port}: {why}") from None
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="pcp-status", daemon=True)
    thread.start()
    bound_host, bound_port = server.server_address[:2]
    assert isinstance(bound_host, str)  # an IP socket's address
    address = (bound_host, bound_port)
    url = f"http://{_url_host(address[0])}:{address[1]}/status"
    status.describe(status_url=url)  # the dashboard shows it: with port 0, where it is
    log.info("status endpoint", url=url)
    try:
        yield address
    finally:
        server.shutdown()
        server.server_close()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _handler(status: RunStatus) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "pcp-status"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            snapshot = status.snapshot()
            if path == "/healthz":
                state = snapshot["run"]["state"]
                healthy = state not in UNHEALTHY
                self._send(200 if healthy else 503, "text/plain", "ok\n" if healthy else state)
            elif path == "/status":
                body = json.dumps(finite_json(snapshot), allow_nan=False)
                self._send(200, "application/json", body)
            elif path == "/metrics":
                self._send(200, PROMETHEUS_TYPE, prometheus_text(snapshot))
            else:
                self._send(404, "text/plain", "not found: try /healthz, /status or /metrics\n")

        def _send(self, code: int, content_type: str, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # requests are not run events: a scraper every 15 s would flood the log

    return Handler


# name, type, help, where in the snapshot's "run"
RUN_METRICS = (
    ("pcp_step", "gauge", "Inner steps done (per worker, for diloco).", "step"),
    ("pcp_total_steps", "gauge", "Inner steps the run will do.", "total_steps"),
    ("pcp_round", "gauge", "The last round finished (diloco).", "round"),
    ("pcp_tokens_total", "counter", "Training tokens processed, all workers.", "tokens"),
    ("pcp_tokens_per_second", "gauge", "Training tokens per second, all workers.", "tokens_per_s"),
    ("pcp_train_loss", "gauge", "The last training loss.", "loss"),
    ("pcp_val_loss", "gauge", "The last validation loss.", "val_loss"),
    ("pcp_bytes_sent_total", "counter", "Bytes the shepherd sent in rounds.", "bytes_sent"),
    ("pcp_bytes_received_total", "counter", "Bytes the shepherd received.", "bytes_received"),
    ("pcp_elapsed_seconds", "gauge", "Seconds since the run started.", "elapsed_s"),
    ("pcp_eta_seconds", "gauge", "Estimated seconds until the run ends.", "eta_s"),
    (
        "pcp_compute_utilisation",
        "gauge",
        "Share of the workers' time in inner steps since training began (distributed).",
        "compute_utilisation",
    ),
)
LAST_ROUND_METRICS = (
    ("pcp_round_compute_seconds", "Compute time of the last round.", "compute_s"),
    ("pcp_round_communication_seconds", "Communication time of the last round.", "communication_s"),
    (
        "pcp_round_compute_utilisation",
        "Share of the workers' time in inner steps in the last round.",
        "compute_utilisation",
    ),
    (
        "pcp_round_pseudo_gradient_bytes",
        "The last round's accepted pseudo-gradients as they crossed the link (--codec).",
        "pseudo_gradient_bytes",
    ),
    (
        "pcp_round_pseudo_gradient_raw_bytes",
        "The same pseudo-gradients as float32.",
        "pseudo_gradient_raw_bytes",
    ),
    ("pcp_round_encode_seconds", "The slowest worker's encoding of its last result.", "encode_s"),
    ("pcp_round_decode_seconds", "The shepherd's decoding of the last results.", "decode_s"),
)
WORKER_METRICS = (
    ("pcp_worker_loss", "The worker's last loss.", "loss"),
    ("pcp_worker_steps_per_second", "The worker's inner steps per second.", "steps_per_s"),
    ("pcp_worker_tokens_per_second", "The worker's tokens per second.", "tokens_per_s"),
    ("pcp_worker_rounds_total", "Results of the worker's that counted.", "rounds"),
    ("pcp_worker_compute_seconds", "Its last round's seconds in inner steps.", "compute_s"),
    ("pcp_worker_wait_seconds", "Its last round's seconds waiting for the shepherd.", "wait_s"),
    ("pcp_worker_send_seconds", "Its last round's seconds sending.", "send_s"),
    ("pcp_worker_last_heard_seconds", "Seconds since the worker last spoke.", "last_heard_s"),
)


def prometheus_text(snapshot: dict[str, Any]) -> str:
    """The snapshot in Prometheus's text format; a value not known yet is left out."""
    run = snapshot["run"]
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, Any]]) -> None:
        known = [(labels, value) for labels, value in samples if _number(value)]
        if not known:
            return
        lines.extend((f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"))
        lines.extend(f"{name}{labels} {float(value)!r}" for labels, value in known)

    for name, kind, help_text, key in RUN_METRICS:
        family(name, kind, help_text, [("", run.get(key))])
    last_round = run.get("last_round") or {}
    for name, help_text, key in LAST_ROUND_METRICS:
        family(name, "gauge", help_text, [("", last_round.get(key))])
    states = [(_labels(state=s), n) for s, n in snapshot["worker_states"].items()]
    family("pcp_workers", "gauge", "Workers by state.", states)
    family(
        "pcp_run_state",
        "gauge",
        "1 for the run's current state.",
        [(_labels(state=run["state"]), 1)],
    )
    for name, help_text, key in WORKER_METRICS:
        samples = [(_worker_labels(w), w.get(key)) for w in snapshot["workers"]]
        family(name, "counter" if name.endswith("_total") else "gauge", help_text, samples)
    worker_state = [(_worker_labels(w, state=w["state"]), 1) for w in snapshot["workers"]]
    family("pcp_worker_state", "gauge", "1 for each worker's current state.", worker_state)
    return "\n".join(lines) + "\n"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _worker_labels(worker: dict[str, Any], **extra: str) -> str:
    return _labels(
        worker=str(worker["index"]),
        name=worker["name"],
        backend=worker["backend"],
        arch=worker["arch"],
        **extra,
    )


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
