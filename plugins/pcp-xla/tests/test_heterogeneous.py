"""One DiLoCo run with an XLA worker and an IREE CPU worker, each on its own artifact."""

import json
import subprocess
import sys
from pathlib import Path

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16"]


def test_xla_and_iree_workers_train_together(tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = [sys.executable, "-m", "pcp_core", "train", "--algorithm", "diloco"]
    command += ["--worker-backends", "xla,cpu", "--steps", "30", "--inner-steps", "10"]
    command += ["--eval-every", "10", "--batch-size", "4", "--out", str(out), *TINY]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    joined = [line for line in result.stderr.splitlines() if "worker joined" in line]
    assert any(", xla/cpu)" in line for line in joined), joined
    assert any(", cpu/" in line for line in joined), joined
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["workers"] for r in records] == [2, 2, 2]
    assert records[-1]["val_loss"] < records[0]["val_loss"]
