"""Helpers for the core's tests.

The compile cache is pcp-core's pytest plugin's (pcp_core/testing/pytest_plugin.py): one
per run, made before pytest-xdist starts its workers so they all share it, or the
`PCP_CACHE_DIR` the caller set (nox shares one between its sessions). A test of the cache
itself points `PCP_CACHE_DIR` at a directory of its own.
"""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def run_pcp(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run the `pcp` CLI in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "pcp_core", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=timeout,
    )


def save_small_gpt2(folder: Path, text: str, positions: int) -> None:
    """A 2-layer GPT-2 with a byte-level BPE trained on `text`, saved into `folder` by
    `transformers` as the hub serves one (no hub here)."""
    import torch
    import transformers

    from pcp_core.data import tokenizers

    bpe = tokenizers.train_bpe([text], 300)
    tokenizers.write_tokenizer_dir(bpe, folder, positions)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=bpe.vocab_size, n_positions=positions, n_embd=32, n_layer=2, n_head=2
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of the small default model, trained for 60 steps (for `pcp sample`, `export`)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    result = run_pcp("train", "--steps", "60", "--steps-per-call", "10", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture
def rehearse(tmp_path: Path) -> Callable[..., Any]:
    """Run DiLoCo for real over a scenario's emulated links (pcp_core.rehearsal.harness).

    Call it as `rehearse(scenario, settings, name="run", **run_scenario_options)`; the run
    directory is tmp_path / name. Without root or `ip netns` the test skips, and fails
    when CI is set, since CI runs as root and a missing kernel feature there is a bug to
    see.
    """
    from pcp_core.rehearsal.links import requirements_problem

    problem = requirements_problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"the WAN rehearsal cannot run in CI: {problem}")
        pytest.skip(problem)

    def run(scenario: Any, settings: Any, name: str = "run", **options: Any) -> Any:
        from pcp_core.rehearsal.harness import run_scenario

        return run_scenario(scenario, tmp_path / name, settings, **options)

    return run
