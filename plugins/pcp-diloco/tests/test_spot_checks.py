"""Spot checks with real processes (`--spot-check`, pcp_core.shepherd.spot_checks): the
shepherd re-runs results from the state their round started from, on the CPU. An honest
worker's results are reproduced exactly and never struck; a worker whose result is not
the work it was given (a random direction at its honest norm, which no other check
keeps out every round), or whose state does not follow from its last checked round (a
forged inner state), is struck at each check and quarantined."""

import json
import re
from pathlib import Path
from typing import Any

import pytest

from .test_attacks import run as attack_run

pytestmark = pytest.mark.serial  # several processes a run

ROUNDS, HONEST = 8, 3


def run(e2e: Any, token_file: Path, out: Path, attack: str, *extra: str, attackers: int = 1) -> str:
    """Three honest workers and the attackers, every result checked; the shepherd's log."""
    return attack_run(
        e2e, token_file, out, HONEST, attack, attackers, "--spot-check", "1", *extra, rounds=ROUNDS
    )


def check_lines(log: str, worker: str) -> list[str]:
    return [line for line in log.splitlines() if "spot check" in line and worker in line]


@pytest.mark.parametrize(
    ("attack", "problem"),
    [
        ("random", "differs from the round re-run from its state"),
        ("forge:4", "started from another state than the one its round"),
    ],
)
def test_a_result_that_is_not_the_work_is_caught_and_honest_ones_pass(
    e2e: Any, token_file: Path, tmp_path: Path, attack: str, problem: str
) -> None:
    out = tmp_path / "run"
    # the loss scoring off: what keeps the attacker out here is the check alone
    log = run(e2e, token_file, out, attack, "--result-check", "none")
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["quarantined"]) == ["attacker-0"], summary["quarantined"]
    assert list(summary["strikes"]) == ["attacker-0"], summary["strikes"]
    struck = [line for line in log.splitlines() if problem in line and "attacker-0" in line]
    assert struck, log[-3000:]
    rounds = [int(m.group(1)) for line in struck if (m := re.search(r"\bround=(\d+)", line))]
    assert min(rounds) <= 2, rounds
    # every honest result checked was reproduced exactly (the honest workers joined first)
    for i in range(HONEST):
        lines = check_lines(log, f"worker {i} (")
        assert len(lines) >= ROUNDS - 1, (i, len(lines))
        assert all(re.search(r"(?<!_)\bdifference=0\.0\b", line) for line in lines), lines[:2]
    assert summary["spot_checks"]["checks"] >= HONEST * (ROUNDS - 1)
    assert summary["spot_checks"]["failures"] >= 1
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(record["spot_checks"] >= HONEST for record in records)
    assert all(record["spot_check_s"] > 0 for record in records)


def test_spot_checks_refuse_rounds_they_cannot_re_run(e2e: Any, tmp_path: Path) -> None:
    handle = e2e.run_pcp(
        "train",
        *("train", "--algorithm", "diloco", "--backend", "cpu", "--workers", "2"),
        *("--steps", "20", "--inner-steps", "10"),
        *("--spot-check", "0.5", "--overlap", "delayed", "--out", str(tmp_path / "run")),
    )
    assert handle.process.returncode != 0
    assert "--spot-check re-runs whole rounds" in handle.err()


def test_two_colluding_ratchets_of_five_are_caught_by_the_checks(
    e2e: Any, token_file: Path, tmp_path: Path
) -> None:
    """Half the merge's weight growing 1.5x a round looks plausible to every score (the
    norm's median moves with them); re-running their rounds does not."""
    out = tmp_path / "run"
    log = run(e2e, token_file, out, "ratchet:1.5", attackers=2)
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["quarantined"]) == ["attacker-0", "attacker-1"], summary["strikes"]
    for i in range(2):
        struck = [
            int(m.group(1))
            for line in log.splitlines()
            if f"attacker-{i}" in line and "differs from the round re-run" in line
            if (m := re.search(r"\bround=(\d+)", line))
        ]
        assert struck and min(struck) == 1, struck  # round 0's ratchet is G^0 = 1: honest
