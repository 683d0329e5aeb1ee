"""`pcp sample --backend`: the key/value-cache sampler gives the uncached sampler's text,
on IREE backends and through jax (the model suite checks nanogpt's `decode` itself)."""

from pathlib import Path

import pytest

from pcp_core import plugins
from pcp_core.backends import DeviceError
from tests.conftest import run_pcp

# 100 tokens: past the 64-token block, so the context slides on the way
SETTINGS = ("--prompt", "The ", "--tokens", "100", "--temperature", "0.8", "--seed", "7")


def sample(run_dir: Path, *args: str) -> tuple[str, str]:
    result = run_pcp("sample", str(run_dir), *SETTINGS, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr


@pytest.fixture(scope="module")
def uncached(trained_run: Path) -> str:
    text, stderr = sample(trained_run)
    assert "tokens/s (jax cpu)" in stderr
    return text


@pytest.mark.parametrize("backend", ["cpu", "xla", "vulkan"])
def test_the_cache_gives_the_same_text(trained_run: Path, uncached: str, backend: str) -> None:
    """cpu and vulkan (lavapipe, where no GPU) run IREE modules, xla runs jax."""
    chosen = plugins.host().backend(backend)
    try:
        chosen.runtime.require_device(chosen, None)
    except DeviceError as error:
        pytest.skip(f"no {backend} device here: {error}")
    text, stderr = sample(trained_run, "--backend", backend)
    assert text == uncached
    assert "100 tokens in " in stderr and f"tokens/s ({backend}, cached)" in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", "e" * 65], "--prompt is 65 tokens, more than the model's block size (64)"),
        (["--backend", "tpu-v9"], "tpu-v9"),
        (["--target", "sm_90"], "give --backend too"),
    ],
)
def test_bad_input_is_one_line(trained_run: Path, args: list[str], message: str) -> None:
    result = run_pcp("sample", str(trained_run), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""
