"""`pcp sample`: text from a trained run's checkpoint, deterministic by seed, one-line errors."""

from pathlib import Path

import numpy as np
import pytest

from pcp_core import plugins
from pcp_core.program import checkpoint, nanogpt, sampling
from tests.conftest import run_pcp

PROMPT = "The "


def sample(*args: str) -> str:
    result = run_pcp("sample", *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("\n")
    return result.stdout[:-1]


def test_prints_the_prompt_and_the_tokens_asked_for(trained_run: Path) -> None:
    # 100 tokens: more than the 64-token block, so the context is cropped on the way
    text = sample(str(trained_run), "--prompt", PROMPT, "--tokens", "100", "--seed", "1")
    assert text.startswith(PROMPT) and len(text) == len(PROMPT) + 100  # chars: 1 token each
    _, metadata = checkpoint.load(trained_run / "checkpoint.safetensors")
    assert set(text) <= set(metadata["vocabulary"])


def test_a_seed_gives_the_same_text(trained_run: Path) -> None:
    args = (str(trained_run), "--prompt", PROMPT, "--tokens", "40", "--temperature", "0.8")
    first, again = sample(*args, "--seed", "7"), sample(*args, "--seed", "7")
    assert first == again
    assert sample(*args, "--seed", "8") != first
    # top-k 1 always takes the likeliest token, whatever the seed
    assert sample(*args, "--top-k", "1", "--seed", "1") == sample(*args, "--top-k", "1")


def test_an_old_checkpoint_with_only_a_vocabulary(trained_run: Path, tmp_path: Path) -> None:
    """Checkpoints from before the tokenizer was stored sample with a chars tokenizer."""
    tensors, metadata = checkpoint.load(trained_run / "checkpoint.safetensors")
    del metadata["tokenizer"]
    checkpoint.save(tmp_path / "checkpoint.safetensors", tensors, metadata)
    same = {"prompt": PROMPT, "tokens": 30, "top_k": 5, "seed": 3}
    host = plugins.host()
    assert (
        sampling.sample(tmp_path, plugins=host, **same).text
        == sampling.sample(trained_run, plugins=host, **same).text
    )


def test_the_padded_window_gives_the_contexts_logits() -> None:
    """The causal mask keeps the padding after the context out of its last logits."""
    import jax.numpy as jnp

    config = nanogpt.MODEL.config({"vocab_size": 30})
    params = nanogpt.init(config, seed=0)
    context = [3, 5, 7, 9, 11]
    window = np.zeros((1, config["block_size"]), np.int32)
    window[0, : len(context)] = context
    padded = sampling._next_logits(nanogpt.MODEL, config)(params, window, np.int32(4))
    plain = nanogpt.logits(config, params, jnp.asarray([context], jnp.int32))[0, -1]
    np.testing.assert_allclose(np.asarray(padded), np.asarray(plain), atol=1e-5)


def test_pick() -> None:
    rng = np.random.default_rng(0)
    logits = np.array([0.0, 3.0, 1.0, 2.9])
    assert {sampling.pick(logits, 1.0, 1, rng) for _ in range(20)} == {1}
    assert {sampling.pick(logits, 5.0, 2, rng) for _ in range(200)} == {1, 3}
    # a low temperature all but always takes the likeliest
    assert {sampling.pick(logits, 0.01, None, rng) for _ in range(20)} == {1}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}"], "no such run directory"),
        (["{empty}"], "no checkpoint"),
        (["{run}", "--prompt", "snow ☃"], "character '☃' is not in the vocabulary"),
        (["{run}", "--prompt", ""], "--prompt is empty"),
        (["{run}", "--tokens", "0"], "--tokens must be positive, got 0"),
        (["{run}", "--temperature", "0"], "--temperature must be a positive number, got 0.0"),
        (["{run}", "--top-k", "0"], "--top-k must be at least 1, got 0"),
    ],
)
def test_bad_input_is_one_line(
    trained_run: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    places = {"missing": tmp_path / "nowhere", "empty": tmp_path, "run": trained_run}
    result = run_pcp("sample", *(arg.format(**places) for arg in args))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""
