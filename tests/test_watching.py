"""Watching a run: the status it keeps, the dashboard drawn from it, the status endpoint,
`pcp status` and the log lines.

The end-to-end test runs a real DiLoCo run in a pseudo-terminal, reads its screen
through a terminal emulator (pyte) as a person would see it, and asks the status
endpoint and `pcp status` while the run goes on.
"""

import json
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from pcp_core.watch.dashboard import braille_chart, render
from pcp_core.watch.run_status import RunStatus
from pcp_core.watch.status_server import prometheus_text, serving
from tests.conftest import run_pcp

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16"]


def a_run() -> RunStatus:
    """A two-worker DiLoCo run in its third round: one worker training, one dead."""
    status = RunStatus(log_progress=False)
    status.describe(algorithm="diloco", backend="cpu", rounds=10, parameters=107_520)
    status.start(500, "diloco on 2 workers")
    status.worker_joined(0, "alpha:1", "cpu", "x86-64-v3", "127.0.0.1:5000", lambda: time.time())
    status.worker_joined(1, "beta:2", "vulkan", "ampere", "10.0.0.2:5001")
    for index in (0, 1):
        status.worker_state(index, "compiling")
        status.worker_state(index, "ready")
    for round_index, loss in enumerate((3.1, 2.5)):
        status.worker_state(0, "training", round_index, inner_steps=50)
        status.worker_result(0, loss, 50, 51_200, 2.0, 0.3, 0.2)
        status.record(
            {"round": round_index, "step": 50 * (round_index + 1), "loss": loss,
             "worker_losses": {"0": loss}, "tokens": 51_200 * (round_index + 1),
             "bytes_sent": 860_000, "bytes_received": 860_100, "compute_s": 2.0,
             "communication_s": 0.1, "compute_utilisation": 0.4,
             "run_compute_utilisation": (0.3, 0.45)[round_index],
             **({"val_loss": 2.6} if round_index else {})}
        )  # fmt: skip
        status.update(50 * (round_index + 1), loss=loss, tokens_per_s=25_600.0)
    status.worker_state(0, "training", 2, inner_steps=50)
    status.worker_state(1, "dead")
    return status


def text_of(renderable, width: int = 140) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def test_the_snapshot_holds_what_the_dashboard_shows() -> None:
    snapshot = a_run().snapshot()
    run, (alpha, beta) = snapshot["run"], snapshot["workers"]
    assert (run["state"], run["step"], run["round"], run["rounds"]) == ("training", 100, 1, 10)
    assert run["loss"] == 2.5 and run["val_loss"] == 2.6 and run["tokens"] == 102_400
    assert run["bytes_sent"] == 1_720_000 and run["last_round"]["compute_s"] == 2.0
    assert run["eta_s"] is not None and run["eta_s"] >= 0
    assert (alpha["state"], alpha["round"], alpha["rounds"], alpha["loss"]) == (
        "training",
        2,
        2,
        2.5,
    )
    assert alpha["steps_per_s"] == 25.0 and alpha["tokens_per_s"] == 25_600.0
    assert (alpha["compute_s"], alpha["wait_s"], alpha["send_s"]) == (2.0, 0.3, 0.2)
    assert run["compute_utilisation"] == 0.45 and run["last_round"]["compute_utilisation"] == 0.4
    assert alpha["inner_step"] == 0 and alpha["last_heard_s"] < 5
    assert beta["state"] == "dead" and beta["last_heard_s"] is None
    assert snapshot["worker_states"]["training"] == 1 and snapshot["worker_states"]["dead"] == 1
    assert [p["loss"] for p in snapshot["history"]] == [3.1, 2.5]
    json.dumps(snapshot, allow_nan=False)  # what /status serves


def test_the_dashboard_draws_the_run() -> None:
    screen = text_of(render(a_run().snapshot(), 140))
    assert "PCP · diloco · cpu · 107.5K parameters" in screen
    assert "round 2/10" in screen and "step 100/500" in screen and "25,600 tok/s" in screen
    row = next(line for line in screen.splitlines() if "alpha:1" in line)
    values = ("cpu/x86-64-v3", "127.0.0.1:5000", "training", "~0/50", "2.5000", "25.0")
    for value in (*values, "2.0/0.3/0.2s"):
        assert value in row, row
    dead = next(line for line in screen.splitlines() if "beta:2" in line)
    assert "dead" in dead and "vulkan/ampere" in dead
    assert "━ train 2.5000" in screen and "━ validation 2.6000" in screen
    assert "last round: sent 839.8 KiB, received 839.9 KiB" in screen
    assert "compute utilisation 40% last round, 45% so far" in screen


def test_the_chart_draws_a_falling_line_from_top_left_to_bottom_right() -> None:
    chart = braille_chart([([(0, 3.0), (1, 2.0), (2, 1.0)], "green")], 28, 4).plain
    rows = chart.splitlines()
    assert rows[0].startswith("  3.000┤") and rows[3].startswith("  1.000┤")
    plot = [row[8:] for row in rows[:4]]
    assert plot[0][0] != " " and plot[0][-1] == " "  # starts high on the left
    assert plot[3][-1] != " " and plot[3][0] == " "  # ends low on the right


def test_metrics_are_prometheus_text() -> None:
    text = prometheus_text(a_run().snapshot())
    families = {f.name: f for f in text_string_to_metric_families(text)}
    value = {name: family.samples[0].value for name, family in families.items()}
    assert value["pcp_step"] == 100 and value["pcp_train_loss"] == 2.5
    assert value["pcp_round_compute_seconds"] == 2.0
    assert value["pcp_compute_utilisation"] == 0.45
    assert value["pcp_round_compute_utilisation"] == 0.4
    waits = {s.labels["worker"]: s.value for s in families["pcp_worker_wait_seconds"].samples}
    assert waits == {"0": 0.3}
    assert families["pcp_tokens"].type == "counter"  # pcp_tokens_total, as parsed
    states = {s.labels["state"]: s.value for s in families["pcp_workers"].samples}
    assert states["training"] == 1 and states["dead"] == 1 and states["joining"] == 0
    losses = {s.labels["name"]: s.value for s in families["pcp_worker_loss"].samples}
    assert losses == {"alpha:1": 2.5}  # the dead worker never reported a loss
    heard = families["pcp_worker_last_heard_seconds"].samples
    assert [s.labels["worker"] for s in heard] == ["0"]  # in-process workers are not heard


def test_the_endpoint_answers_and_refuses_a_port_in_use() -> None:
    status = a_run()
    with serving(status, "127.0.0.1", 0) as (host, port):
        base = f"http://{host}:{port}"
        assert urllib.request.urlopen(base + "/healthz").read() == b"ok\n"
        assert json.loads(urllib.request.urlopen(base + "/status").read())["run"]["step"] == 100
        metrics = urllib.request.urlopen(base + "/metrics")
        assert metrics.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(base + "/nothing")
        status.set_state("failed")
        with pytest.raises(urllib.error.HTTPError, match="503"):
            urllib.request.urlopen(base + "/healthz")
        from pcp_core.config import ConfigError

        with pytest.raises(ConfigError, match=f"cannot serve the status endpoint on .*:{port}"):
            serving(status, "127.0.0.1", port).__enter__()


def test_logs_are_json_lines_off_a_terminal(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["train", "--steps", "20", "--batch-size", "4", "--eval-every", "0", *TINY]
    result = run_pcp(*args, "--out", str(out), env={"PCP_LOG_FORMAT": "auto"})
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert events and all({"event", "level", "timestamp"} <= set(e) for e in events)
    states = [e["state"] for e in events if e["event"] == "worker state"]
    assert states == ["joining", "compiling", "training"]
    assert [e["step"] for e in events if e["event"] == "progress"][-1] == 20
    assert [e["state"] for e in events if e["event"] == "run state"][-1] == "done"
    console = run_pcp("--log-format", "console", *args, "--out", str(out), "--overwrite")
    assert "worker state" in console.stderr and "state=compiling" in console.stderr
    bad = run_pcp("--log-format", "xml", "plugins")
    assert bad.returncode == 2 and "--log-format must be one of auto, console, json" in bad.stderr


@pytest.mark.slow
def test_a_live_run_on_a_terminal(tmp_path: Path) -> None:
    """A person's view: the dashboard on a 150x50 terminal, the endpoint, `pcp status`,
    then Ctrl-C."""
    import pexpect
    import pyte

    out = tmp_path / "run"
    args = ["-m", "pcp_core", "train", "--algorithm", "diloco", "--workers", "2"]
    # far more rounds than the test watches: it ends the run with Ctrl-C once it has seen
    # what it came for, so a fast machine cannot finish the run under its feet
    args += ["--steps", "100000", "--inner-steps", "50", "--batch-size", "4", *TINY]
    # port 0: the run binds a free port itself and the dashboard shows which; a port
    # picked here and let go could be taken by another test's server before the run binds it
    args += ["--status-port", "0", "--out", str(out)]
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "150", "LINES": "50"}
    env.pop("PCP_LOG_FORMAT")  # as a user has it: auto
    run = pexpect.spawn(sys.executable, args, env=env, dimensions=(50, 150), timeout=5)
    screen = pyte.Screen(150, 50)
    stream = pyte.ByteStream(screen)

    def read_screen() -> str:
        """The screen after what the run wrote: until it pauses, or for a second at
        most, since a run of such fast rounds may never pause (its evaluations log a
        line every few rounds) and would otherwise be read to its end."""
        until = time.monotonic() + 1.0
        try:
            while time.monotonic() < until:
                stream.feed(run.read_nonblocking(65536, timeout=0.2))
        except (pexpect.TIMEOUT, pexpect.EOF):
            pass
        return "\n".join(screen.display)

    def live_rows(shown: str) -> list[str]:
        """Rows of the workers table with a state, a loss (column 7) and a speed (8)."""
        rows = [ln for ln in shown.splitlines() if "cpu/" in ln and "127.0.0.1:" in ln]
        states = (" training ", " reporting ", " ready ")
        return [r for r in rows if any(s in r for s in states) and "." in r.split("│")[7]]

    def whole_dashboard(shown: str) -> bool:
        """Both workers live and every part drawn: a read can catch the run mid-redraw,
        with log lines scrolling through."""
        parts = ("workers", "PCP · diloco · cpu", "tok/s", "━ train", "compute", "/status")
        return len(live_rows(shown)) == 2 and all(part in shown for part in parts)

    try:
        deadline = time.monotonic() + 240
        shown = read_screen()
        while not whole_dashboard(shown):
            assert run.isalive() and time.monotonic() < deadline, shown
            shown = read_screen()
        (tmp_path / "screen.txt").write_text(shown)
        shown_url = re.search(r"http://127\.0\.0\.1:(\d+)/status", shown)
        assert shown_url, shown
        port = int(shown_url.group(1))
        base = f"http://127.0.0.1:{port}"
        assert urllib.request.urlopen(base + "/healthz").read() == b"ok\n"
        live = json.loads(urllib.request.urlopen(base + "/status").read())
        assert live["run"]["state"] in ("training", "evaluating") and len(live["workers"]) == 2
        metrics = urllib.request.urlopen(base + "/metrics").read().decode()
        names = {f.name for f in text_string_to_metric_families(metrics)}
        assert {"pcp_step", "pcp_worker_loss", "pcp_workers", "pcp_round"} <= names
        printed = run_pcp("status", f"127.0.0.1:{port}", env={"COLUMNS": "150"})
        assert printed.returncode == 0 and "workers" in printed.stdout, printed.stderr
        assert printed.stdout.count("cpu/") == 2
        run.sendintr()  # Ctrl-C, as a person ends a run
        run.expect(pexpect.EOF, timeout=120)
        stream.feed(run.before)
        final = "\n".join(screen.display)
    finally:
        run.close(force=True)
    assert run.exitstatus == 130, final
    assert "interrupted" in final and "PCP · diloco" in final
    gone = run_pcp("status", f"127.0.0.1:{port}")
    assert gone.returncode == 2 and f"no status at http://127.0.0.1:{port}/status" in gone.stderr


def test_encoded_pseudo_gradients_are_shown_with_their_float32_size() -> None:
    status = a_run()
    status.record(
        {"round": 2, "step": 150, "loss": 2.2, "worker_losses": {"0": 2.2}, "tokens": 153_600,
         "bytes_sent": 860_000, "bytes_received": 220_000, "compute_s": 2.0,
         "communication_s": 0.1, "compute_utilisation": 0.5, "run_compute_utilisation": 0.5,
         "pseudo_gradient_bytes": 219_000, "pseudo_gradient_raw_bytes": 860_000,
         "encode_s": 0.012, "decode_s": 0.004}
    )  # fmt: skip
    snapshot = status.snapshot()
    screen = text_of(render(snapshot, 200), 200)
    assert "pseudo-gradients encoded 213.9 KiB of 839.8 KiB (3.9x" in screen
    families = {f.name: f for f in text_string_to_metric_families(prometheus_text(snapshot))}
    assert families["pcp_round_pseudo_gradient_bytes"].samples[0].value == 219_000
    assert families["pcp_round_pseudo_gradient_raw_bytes"].samples[0].value == 860_000
    assert families["pcp_round_encode_seconds"].samples[0].value == 0.012
