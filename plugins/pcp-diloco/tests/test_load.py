"""Sixteen workers on one machine: every one of them takes part in every round."""

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.alone  # sixteen workers fill the machine

SMALL = ("--n-layer", "1", "--n-head", "1", "--n-embd", "16", "--block-size", "16")


@pytest.mark.slow
def test_sixteen_workers(e2e: Any, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = e2e.run_pcp(
        "train",
        *("train", "--algorithm", "diloco", "--backend", "cpu", "--workers", "16"),
        *("--steps", "40", "--inner-steps", "10", "--eval-every", "0", "--batch-size", "4"),
        *("--out", str(out), *SMALL),
        timeout=900,
    )
    assert run.process.returncode == 0, run.output()[-4000:]
    records = e2e.metrics(out)
    assert [r["workers"] for r in records] == [16] * 4
    assert all(r["rejected"] == {} and r["attempts"] == 1 for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 4 and summary["shepherd_peak_rss_bytes"] > 0
