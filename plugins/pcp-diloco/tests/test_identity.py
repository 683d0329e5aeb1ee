"""Workers with credentials of their own, with real processes: each joins under the name
it proved, a shared secret is not enough, and a worker revoked while the run goes on is
out of the next round and cannot rejoin."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pcp_core.wire.credentials import Issuer

from .test_faults import finished

pytestmark = pytest.mark.serial  # rounds of seconds, watched as they come


def test_a_worker_revoked_mid_run_is_out_within_a_round(
    e2e: Any, tiny: tuple[str, ...], token_file: Path, tmp_path: Path
) -> None:
    key = tmp_path / "issuer.key"
    issuer = Issuer(key)
    for name in ("alice", "bob"):
        (tmp_path / f"{name}.credential").write_text(issuer.issue(name).to_json())
        (tmp_path / f"{name}.credential").chmod(0o600)
    out = tmp_path / "run"
    shepherd, address = e2e.shepherd(
        *("--backend", "cpu", "--workers", "2", "--min-workers", "1", "--issuer-key", str(key)),
        *("--steps", "4000", "--inner-steps", "10", "--eval-every", "0", "--out", str(out)),
        *("--status-port", "0", *tiny),
    )
    for name in ("alice", "bob"):
        credential = str(tmp_path / f"{name}.credential")
        e2e.pcp(name, "worker", "--connect", address, "--credential", credential)
    shared = e2e.pcp("shared", "worker", "--connect", address, "--token-file", str(token_file))
    assert shared.wait(120) != 0
    assert "own credential" in shared.err(), shared.err()[-2000:]
    e2e.wait_for(lambda: len(e2e.metrics(out)) >= 3, 240, "three rounds")
    command = [sys.executable, "-m", "pcp_core", "token", "revoke", "bob", "--issuer-key", str(key)]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    revoked_at = len(e2e.metrics(out))  # rounds recorded once the revocation is written
    e2e.wait_for(
        lambda: any(r["workers"] == 1 for r in e2e.metrics(out)[revoked_at:]),
        120,
        "a round without the revoked worker",
    )
    e2e.wait_for(  # its supervisor tries again while the run goes on: refused
        lambda: "the credential of bob" in shepherd.err(), 120, "the revoked worker refused"
    )
    log = finished(shepherd)
    records = e2e.metrics(out)
    first_alone = next(r["round"] for r in records[revoked_at:] if r["workers"] == 1)
    assert first_alone <= revoked_at + 1, (revoked_at, first_alone)
    assert all(r["workers"] == 1 for r in records if r["round"] > first_alone)
    assert "credential revoked; disconnecting the worker" in log and "(bob," in log
    assert "(alice, cpu/" in log  # the proven names in the shepherd's lines
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 400
