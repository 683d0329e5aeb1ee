"""A real DiLoCo run over emulated links: `pcp shepherd` and two `pcp worker`s, each in
its own network namespace, over scenarios/ci.toml (pcp_core.rehearsal.harness).

Slow (about 20 s): `pytest -m slow tests/test_rehearsal_run.py`. Needs root and `ip
netns`; skips without them, fails when CI is set (the `rehearse` fixture).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from pcp_core.rehearsal.harness import TrainingSettings
from pcp_core.rehearsal.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
TINY = ("--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32")
SETTINGS = TrainingSettings(
    steps=40, inner_steps=10, seed=0, shepherd_flags=(*TINY, "--steps-per-call", "10")
)


@pytest.mark.slow
def test_diloco_runs_over_the_ci_scenario_and_pays_its_round_trip(rehearse) -> None:
    from pcp_core.rehearsal.links import list_namespaces

    scenario = load_scenario(ROOT / "scenarios" / "ci.toml")
    result = rehearse(scenario, SETTINGS, timeout_s=600)

    assert result.exit_codes == {"shepherd": 0, "ci-0": 0, "ci-1": 0}
    rounds = result.rounds
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    assert all(r["workers"] == 2 for r in rounds), [r["workers"] for r in rounds]
    assert math.isfinite(result.summary["final_val_loss"])
    assert all(math.isfinite(r["loss"]) for r in rounds)
    # A round sends parameters and gets results back over both links: at least one
    # round trip, 2 x (20 ms + 5 ms), beyond the compute.
    round_trip_s = 2 * (scenario.workers[0].link.delay_ms + scenario.shepherd.delay_ms) / 1000
    assert all(r["communication_s"] >= round_trip_s for r in rounds), rounds
    assert list_namespaces(f"pcpw-{os.getpid()}-") == []
