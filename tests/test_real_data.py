"""Real data and real model sizes, end to end through the CLI (slow)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pcp_core.data import corpus

pytestmark = pytest.mark.slow

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def pcp(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pcp_core", *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"no {SHAKESPEARE} here")
def test_bpe_on_tinyshakespeare_trains_and_samples_readable_text(tmp_path: Path) -> None:
    data, run = tmp_path / "data", tmp_path / "run"
    pcp("data", "prepare", str(SHAKESPEARE), "-o", str(data), "--tokenizer", "bpe",
        "--vocab-size", "512")  # fmt: skip
    pcp("train", "--data", str(data), "--steps", "400", "--out", str(run))
    val = [r["val_loss"] for r in records(run) if "val_loss" in r]
    assert len(val) == 4 and val[-1] < val[0] - 0.3, val  # it learns, on held-out text
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_val_loss"] < summary["unigram_entropy"] - 1.0

    text = pcp("sample", str(run), "--prompt", "ROMEO:", "--tokens", "200", "--seed", "1").stdout
    assert text.startswith("ROMEO:") and len(text) > 300
    words = text.split()
    # a bytes-level BPE could emit any byte; trained, it writes lines of mostly real words
    common = {"the", "and", "to", "of", "my", "I", "a", "you", "that", "is", "in", "me"}
    assert sum(w.strip(",.;:!?'") in common for w in words) >= 5, text
    assert "\ufffd" not in text and sum(c.isalpha() or c.isspace() for c in text) > 0.9 * len(text)


def test_gpt2_small_compiles_and_trains_a_few_steps_on_the_cpu(tmp_path: Path) -> None:
    """GPT-2 small's size (12 layers, 12 heads, 768 wide, context 1024) at batch 1."""
    source, data, run = tmp_path / "corpus.txt", tmp_path / "data", tmp_path / "run"
    source.write_text(corpus.generate(400_000), encoding="utf-8")
    pcp("data", "prepare", str(source), "-o", str(data), "--tokenizer", "bpe",
        "--vocab-size", "512")  # fmt: skip
    vocab = json.loads((data / "manifest.json").read_text())["vocab_size"]
    done = pcp("train", "--data", str(data), "--model-size", "gpt2-small", "--batch-size", "1",
               "--steps", "2", "--steps-per-call", "1", "--eval-batches", "1",
               "--out", str(run))  # fmt: skip
    assert "estimated_memory" in done.stderr + done.stdout
    summary = json.loads((run / "summary.json").read_text())
    width, layers, block = 768, 12, 1024
    per_layer = 12 * width * width + 13 * width  # attention and MLP weights, biases, norms
    assert summary["parameters"] == (vocab + block) * width + layers * per_layer + 2 * width
    assert summary["config"]["model_size"] == "gpt2-small"
    losses = [r["loss"] for r in records(run)]
    assert len(losses) == 2 and np.isfinite(losses).all()
    assert abs(summary["final_val_loss"] - math.log(vocab)) < 1.0  # an untrained model's loss
