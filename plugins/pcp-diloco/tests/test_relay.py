"""A relay without the secret between a real shepherd and a real worker (relay.py).

It passes the join through untouched, so both ends authenticate each other; everything
after the join is sealed, so what the relay changes, injects or replays is refused, and
no altered program is ever loaded. A relay that changes nothing shows the path works.
"""

import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.serial  # a 20 s join timeout

RELAY = Path(__file__).with_name("relay.py")


def start_run(e2e: Any, token_file: Path, tmp_path: Path, tiny: tuple[str, ...], mode: str):
    """A shepherd for one worker, a relay in `mode` in front of it, and a worker
    (unsupervised) that connects through the relay."""
    shepherd, address = e2e.shepherd(
        *("--backend", "cpu", "--workers", "1", "--join-timeout", "20"),
        *("--steps", "20", "--inner-steps", "10", "--eval-every", "0"),
        *("--token-file", str(token_file), "--out", str(tmp_path / "run"), *tiny),
    )
    relay_port, port = e2e.free_port(), address.rpartition(":")[2]
    e2e.own(f"127.0.0.1:{relay_port}")
    relay = e2e.start("relay", [sys.executable, str(RELAY), str(relay_port), port, mode])
    e2e.wait_for(lambda: "relay listening" in relay.stdout.read_text(), 30, "the relay")
    worker = e2e.pcp(
        "worker",
        *("worker", "--connect", f"127.0.0.1:{relay_port}", "--backend", "cpu"),
        *("--token-file", str(token_file), "--restarts", "0"),
    )
    return shepherd, relay, worker


def test_a_relay_that_changes_nothing_passes_the_run(
    e2e: Any, token_file: Path, tmp_path: Path, tiny: tuple[str, ...]
) -> None:
    shepherd, _, worker = start_run(e2e, token_file, tmp_path, tiny, "pass")
    assert shepherd.wait(300) == 0, shepherd.output()[-3000:]
    assert worker.wait(30) == 0, worker.output()[-3000:]


@pytest.mark.parametrize(
    ("mode", "refused_by", "what"),
    [
        ("swap-program", "worker", "Setup"),
        ("inject", "worker", "Stop"),
        ("replay", "shepherd", "Result"),
    ],
)
def test_a_relay_cannot_change_inject_or_replay(
    e2e: Any,
    token_file: Path,
    tmp_path: Path,
    tiny: tuple[str, ...],
    mode: str,
    refused_by: str,
    what: str,
) -> None:
    shepherd, relay, worker = start_run(e2e, token_file, tmp_path, tiny, mode)
    assert worker.wait(180) != 0, worker.output()[-3000:]
    assert shepherd.wait(120) != 0, shepherd.output()[-3000:]
    assert "relay: " in relay.stdout.read_text(), "the relay never acted"
    refuser = worker if refused_by == "worker" else shepherd
    assert f"{what} from " in refuser.err() and "failed authentication" in refuser.err()
    # the forged program never reached the loader: not even its hash was checked
    assert "hash mismatch" not in worker.err()
    assert "stopping" not in worker.err(), "the worker obeyed a forged Stop"
    # the shepherd ends with one line: too few workers (it never counted a tampered one)
    assert any(ln.startswith("error: ") and "workers" in ln for ln in shepherd.err().splitlines())
