"""Lion against optax.lion step by step, and a real training run through PCP."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pcp_lion
import pytest

from pcp_core import plugins
from pcp_core.optimizers import InnerSettings


def test_registered_through_the_entry_point() -> None:
    assert plugins.host().optimizer("lion") is pcp_lion.LION


@pytest.mark.parametrize("grad_clip", [0.0, 0.5])
def test_matches_optax_lion(grad_clip: float) -> None:
    import jax
    import optax

    own = pcp_lion.LionSettings(beta1=0.8, beta2=0.95, weight_decay=0.3)
    settings = InnerSettings(
        lr=1e-2, min_lr=1e-3, warmup_steps=3, total_steps=12, grad_clip=grad_clip, own=own
    )
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 3, 12, 1e-3)
    reference = optax.lion(
        schedule, b1=0.8, b2=0.95, weight_decay=0.3,
        mask=lambda params: jax.tree_util.tree_map(lambda p: p.ndim >= 2, params),
    )  # fmt: skip
    if grad_clip:
        reference = optax.chain(optax.clip_by_global_norm(grad_clip), reference)
    ours = pcp_lion.build(settings)
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}
    ours_params, reference_params = dict(params), dict(params)
    ours_state, reference_state = ours.init(params), reference.init(params)
    for _ in range(12):
        grads = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in params.items()}
        ours_updates, ours_state = ours.update(grads, ours_state, ours_params)
        reference_updates, reference_state = reference.update(
            grads, reference_state, reference_params
        )
        ours_params = optax.apply_updates(ours_params, ours_updates)
        reference_params = optax.apply_updates(reference_params, reference_updates)
        for name in params:
            np.testing.assert_allclose(ours_params[name], reference_params[name], rtol=1e-6)


def test_trains_through_pcp(tmp_path: Path) -> None:
    out = tmp_path / "run"
    tiny = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32"]
    command = [sys.executable, "-m", "pcp_core", "train", "--optimizer", "lion", "--lr", "3e-3"]
    command += [*tiny, "--steps", "60", "--eval-every", "60", "--out", str(out)]
    command += ["--weight-decay", "0.2"]  # a flag of its own settings
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["loss"] < 0.8 * records[0]["loss"]
    written = tomllib.loads((out / "config.toml").read_text())
    assert written["lion"] == {"beta1": 0.9, "beta2": 0.99, "weight_decay": 0.2}


def test_a_bad_value_in_its_section_is_one_line_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('optimizer = "lion"\n[lion]\nbeta2 = 1.5\n')
    command = [sys.executable, "-m", "pcp_core", "train", "--config", str(config)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: lion.beta2 must be in [0, 1), got 1.5"
