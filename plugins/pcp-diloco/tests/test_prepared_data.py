"""DiLoCo from a prepared dataset: the corpus never travels whole.

A real shepherd and two real workers: one has the dataset on its disk (`--data`), the
other has nothing and fetches its shards from the shepherd. Each is given disjoint
shards, only the second one fetches, and only its own.
"""

import json
import math
from pathlib import Path
from typing import Any

import pytest

from pcp_core.data import corpus
from pcp_core.wire.shard_transfer import assign_shards

pytestmark = pytest.mark.slow


def prepared(folder: Path, e2e: Any) -> Path:
    text = folder / "corpus.txt"
    text.write_text(corpus.generate(2_000_000), encoding="utf-8")
    data = folder / "data"
    done = e2e.run_pcp("prepare", "data", "prepare", str(text), "-o", str(data),
                       "--shard-tokens", "400000")  # fmt: skip
    assert done.process.returncode == 0, done.output()
    return data


def test_one_worker_reads_its_shards_the_other_fetches_only_its_own(
    e2e: Any, tiny: tuple[str, ...], tmp_path: Path, token_file: Path
) -> None:
    data = prepared(tmp_path, e2e)
    manifest = json.loads((data / "manifest.json").read_text())
    train = [s["name"] for s in manifest["shards"] if s["split"] == "train"]
    assert len(train) >= 4, manifest
    run = tmp_path / "run"
    # four rounds: with the default outer step (momentum 0.7, workers at √2 the lr) the
    # second round's Nesterov step overshoots (validation at the uniform loss) before
    # the third and fourth recover, so a two-round run ends on the overshoot
    steps = ("--steps", "40", "--inner-steps", "10", "--steps-per-call", "10")
    shepherd, address = e2e.shepherd(
        "--data", str(data), "--workers", "2", *tiny, *steps, "--eval-every", "0",
        "--out", str(run), "--token-file", str(token_file),
    )  # fmt: skip
    worker = ("worker", "--connect", address, "--token-file", str(token_file), "--restarts", "0")
    local = e2e.pcp("local", *worker, "--data", str(data), "--state-dir", str(tmp_path / "s0"))
    e2e.wait_for(lambda: "worker joined" in shepherd.err(), 120, "the first worker to join")
    cache = tmp_path / "shard-cache"
    fetching = e2e.pcp(
        "fetching", *worker, "--shard-cache", str(cache), "--state-dir", str(tmp_path / "s1")
    )
    assert shepherd.wait(300) == 0, shepherd.output()
    assert local.wait(30) == 0 and fetching.wait(30) == 0, local.output() + fetching.output()

    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_val_loss"] < 0.9 * math.log(manifest["vocab_size"])  # it learns
    # the second worker to join is index 1; it fetched exactly its share, nothing else
    assert summary["shards_fetched"] == {"1": assign_shards(train, 1, 2)}
    sizes = {s["name"]: s["nbytes"] for s in manifest["shards"]}
    fetched_bytes = sum(sizes[name] for name in assign_shards(train, 1, 2))
    assert fetched_bytes <= summary["shard_bytes"] < fetched_bytes + 4096
    # the Setups (program and optimizer state, to two workers) no longer carry the corpus
    assert summary["setup_bytes"] < sum(sizes.values()) / 2, summary
    cached = sorted(p.name for p in cache.iterdir())
    by_hash = {s["sha256"]: s["name"] for s in manifest["shards"]}
    assert sorted(by_hash[h] for h in cached) == sorted(assign_shards(train, 1, 2))
