"""Named model sizes (`--model-size`), the exact parameter count and the memory estimate."""

import json
from pathlib import Path

import pytest

from pcp_core import config_file
from pcp_core.models import Model
from pcp_core.program import checkpoint, footprint, nanogpt
from tests.conftest import run_pcp

MODEL = nanogpt.MODEL


def test_no_size_is_the_defaults_and_tiny_is_them_too() -> None:
    assert MODEL.config({}) == nanogpt.DEFAULTS
    assert MODEL.config({}, preset="tiny") == nanogpt.DEFAULTS


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        ("shakespeare-char", (6, 6, 384, 256)),
        ("gpt2-small", (12, 12, 768, 1024)),
        ("gpt2-medium", (24, 16, 1024, 1024)),
    ],
)
def test_presets(size: str, expected: tuple[int, int, int, int]) -> None:
    config = MODEL.config({"vocab_size": 65}, preset=size)
    assert (config["n_layer"], config["n_head"], config["n_embd"], config["block_size"]) == (
        expected
    )
    assert config["vocab_size"] == 65  # the data's, never the preset's


def test_explicit_settings_override_the_preset() -> None:
    config = MODEL.config({"n_layer": 3, "block_size": 128, "n_head": None}, preset="gpt2-small")
    assert (config["n_layer"], config["n_head"], config["n_embd"], config["block_size"]) == (
        3,
        12,
        768,
        128,
    )


def test_unknown_size_is_one_line_listing_the_known() -> None:
    with pytest.raises(ValueError, match="no size 'huge'") as error:
        MODEL.config({}, preset="huge")
    assert "tiny, shakespeare-char, gpt2-small, gpt2-medium" in str(error.value)
    plain = Model(name="plain", defaults={"width": 4}, init=lambda c, s: {}, loss=lambda: 0)
    with pytest.raises(ValueError, match="known sizes: none"):
        plain.config({}, preset="tiny")


def test_model_size_comes_from_toml(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('model_size = "shakespeare-char"\nn_layer = 2\n')
    config = config_file.resolve(toml, {})
    assert config.model_size == "shakespeare-char" and config.model_overrides()["n_layer"] == 2


def test_shapes_are_those_init_makes() -> None:
    config = MODEL.config({"n_layer": 3, "vocab_size": 50})
    made = nanogpt.init(config, seed=0)
    assert nanogpt.shapes(config) == {name: array.shape for name, array in made.items()}


def test_gpt2_small_has_gpt2s_parameter_count() -> None:
    """GPT-2 small with tied embeddings and biases everywhere: 124,439,808 parameters."""
    config = MODEL.config({"vocab_size": 50257}, preset="gpt2-small")
    shapes = footprint.parameter_shapes(MODEL, config)  # from shapes: nothing allocated
    estimate = footprint.estimate(shapes.values(), config, batch_size=8)
    assert estimate.parameters == 124_439_808
    assert estimate.weight_bytes == estimate.gradient_bytes == 4 * 124_439_808
    assert estimate.optimizer_bytes == 8 * 124_439_808  # AdamW's two moments
    assert estimate.describe().startswith("124.4M parameters, ~")


def test_shapes_without_a_shapes_function_come_from_init() -> None:
    no_shapes = Model(name="m", defaults=MODEL.defaults, init=MODEL.init, loss=MODEL.loss)
    config = MODEL.config({})
    assert footprint.parameter_shapes(no_shapes, config) == nanogpt.shapes(config)


def test_activation_estimate_follows_its_formula() -> None:
    config = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 32, "vocab_size": 10}
    positions = 3 * 32
    per_layer = positions * (16 * 64 + 2 * 4 * 32)
    assert footprint.activation_floats(config, batch_size=3) == 2 * per_layer + positions * 40
    estimate = footprint.estimate([(10, 64)], config, batch_size=3, optimizer_bytes=7)
    assert estimate.total_bytes == 2 * 4 * 640 + 7 + 4 * (2 * per_layer + positions * 40)
    assert estimate.to_dict()["total_bytes"] == estimate.total_bytes
    other = footprint.estimate([(5,)], {"context": 8}, batch_size=3)
    assert other.activation_bytes is None and "activations not estimated" in other.describe()


def test_human_units() -> None:
    assert footprint.human_count(124_439_808) == "124.4M"
    assert footprint.human_count(999) == "999"
    assert footprint.human_bytes(2_254_857_830) == "2.1 GiB"
    assert footprint.human_bytes(512) == "512 B"


def test_train_prints_the_estimate_and_keeps_it_in_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_pcp(
        "train", "--model-size", "tiny", "--n-layer", "1", "--steps", "10", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert "parameters" in result.stderr and "estimated_memory" in result.stderr
    assert footprint.human_count(summary["parameters"]) in result.stderr
    assert summary["memory_estimate"]["total_bytes"] > 16 * summary["parameters"]
    assert summary["config"]["model_size"] == "tiny"
    params, _ = checkpoint.load(out / "checkpoint.safetensors")
    assert params["wte"].shape[1] == 64 and "h.1.ln_1.weight" not in params  # --n-layer won


def test_unknown_size_from_the_cli_is_one_line(tmp_path: Path) -> None:
    result = run_pcp("train", "--model-size", "huge", "--out", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert "no size 'huge'" in result.stderr and "gpt2-small" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
