"""GPT-2 in Hugging Face's format, in and out (pcp_core.program.huggingface), against
`transformers` itself: a small GPT-2 made and saved by `transformers` in the test (no hub
here) trains on with `--init-from`, its loss at the start equal to `transformers`' own on
the same tokens; an exported run loads in `GPT2LMHeadModel` and `AutoTokenizer` with
PCP's logits and ids; what does not map is refused in one line."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pcp_core import plugins
from pcp_core.config import ConfigError, RunConfig
from pcp_core.program import huggingface, trained, training
from pcp_core.program.footprint import parameter_shapes
from tests.conftest import run_pcp, save_small_gpt2

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXT = "".join(
    f"{name} walks to the {place} and sells {count} loaves of bread before dusk.\n"
    for count in range(40)
    for name, place in (("Ada", "mill"), ("Bram", "market"), ("Cora", "harbour"))
)
BLOCK = 32


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer GPT-2 with a byte-level BPE, saved by `transformers` as the hub serves it."""
    folder = tmp_path_factory.mktemp("gpt2")
    save_small_gpt2(folder, TEXT, 64)
    return folder


@pytest.fixture(scope="module")
def prepared(gpt2_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("data")
    (folder / "village.txt").write_text(TEXT)
    out = folder / "prepared"
    result = run_pcp(
        *("data", "prepare", str(folder / "village.txt"), "--tokenizer", str(gpt2_folder)),
        *("-o", str(out)),
    )
    assert result.returncode == 0, result.stderr
    return out


def hf_logits(model_folder: Path, tokens: np.ndarray) -> np.ndarray:
    model = transformers.GPT2LMHeadModel.from_pretrained(model_folder).eval()
    with torch.no_grad():
        return model(torch.as_tensor(tokens, dtype=torch.long)).logits.numpy()


def test_the_checkpoint_maps_onto_the_built_in_model(gpt2_folder: Path) -> None:
    import jax.numpy as jnp

    pretrained = huggingface.read(gpt2_folder)
    assert pretrained.model_config == {
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 32,
        "block_size": 64,
        "vocab_size": pretrained.tokenizer.vocab_size,
    }
    model = plugins.host().model("nanogpt")
    config = model.config(pretrained.model_config)
    params = huggingface.fitted(pretrained, parameter_shapes(model, config))
    tokens = np.random.default_rng(0).integers(0, config["vocab_size"], (2, 20)).astype(np.int32)
    ours = np.asarray(model.logits(config, params, jnp.asarray(tokens)))
    np.testing.assert_allclose(ours, hf_logits(gpt2_folder, tokens), rtol=0, atol=2e-5)


def test_init_from_starts_at_transformers_loss_on_the_same_tokens(
    gpt2_folder: Path, prepared: Path
) -> None:
    config = RunConfig(data=prepared, init_from=gpt2_folder, block_size=BLOCK, batch_size=4)
    setup = training.prepare(config, plugins.host())
    ours = setup.validation_loss(setup.initial_params())
    inputs, targets = setup.corpus.batches(
        "validation", config.eval_batches, config.batch_size, BLOCK, stream=(config.seed, 0xE7A1)
    )
    logits = hf_logits(gpt2_folder, inputs.reshape(-1, BLOCK))
    losses = torch.nn.functional.cross_entropy(
        torch.as_tensor(logits).reshape(-1, logits.shape[-1]),
        torch.as_tensor(targets.reshape(-1), dtype=torch.long),
    )
    assert ours == pytest.approx(float(losses), abs=1e-4)


@pytest.mark.parametrize("algorithm", ["local", "diloco"])
def test_a_pretrained_model_trains_on_and_goes_back_to_transformers(
    gpt2_folder: Path, prepared: Path, tmp_path: Path, algorithm: str
) -> None:
    out = tmp_path / "run"
    result = run_pcp(
        *("train", "--algorithm", algorithm, "--backend", "cpu", "--init-from", str(gpt2_folder)),
        *("--data", str(prepared), "--block-size", str(BLOCK), "--batch-size", "4"),
        *("--steps", "20", "--steps-per-call", "10", "--out", str(out)),
        *(("--workers", "2", "--inner-steps", "10") if algorithm == "diloco" else ()),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["loss"] < records[0]["loss"]
    exported = tmp_path / "hf"
    result = run_pcp("export", str(out), "--format", "huggingface", "-o", str(exported))
    assert result.returncode == 0, result.stderr
    assert_transformers_reads(out, exported)


def test_an_exported_chars_run_loads_in_transformers(trained_run: Path, tmp_path: Path) -> None:
    exported = tmp_path / "hf"
    result = run_pcp("export", str(trained_run), "--format", "huggingface", "-o", str(exported))
    assert result.returncode == 0, result.stderr
    assert_transformers_reads(trained_run, exported)


def assert_transformers_reads(run_dir: Path, exported: Path) -> None:
    """Logits and token ids of `transformers` equal PCP's."""
    import jax.numpy as jnp

    run = trained.load(run_dir, plugins.host())
    text = "Ada walks to the mill"
    ids = [int(i) for i in run.tokenizer.encode(text)]
    theirs = transformers.AutoTokenizer.from_pretrained(exported)
    assert theirs(text)["input_ids"] == ids
    assert theirs.decode(ids) == text
    tokens = np.asarray([ids], np.int32)
    ours = np.asarray(run.model.logits(run.config, run.params, jnp.asarray(tokens)))
    np.testing.assert_allclose(hf_logits(exported, tokens), ours, rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(activation_function="relu"), "activation 'relu'"),
        (lambda c: c.update(layer_norm_epsilon=1e-6), "layer_norm_epsilon is 1e-06"),
        (lambda c: c.update(model_type="llama"), "model_type is 'llama'"),
        (lambda c: c.update(tie_word_embeddings=False), "tie_word_embeddings is False"),
    ],
)
def test_what_does_not_map_is_refused(gpt2_folder: Path, tmp_path: Path, change, message) -> None:
    folder = tmp_path / "changed"
    shutil.copytree(gpt2_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="--init-from") as raised:
        huggingface.read(folder)
    assert message in str(raised.value)


def test_data_in_other_tokens_is_refused_with_the_command_that_fixes_it(
    gpt2_folder: Path, tmp_path: Path
) -> None:
    text = tmp_path / "village.txt"
    text.write_text(TEXT)
    result = run_pcp(
        *("train", "--init-from", str(gpt2_folder), "--data", str(text), "--steps", "10"),
        *("--block-size", str(BLOCK), "--out", str(tmp_path / "run")),
    )
    assert result.returncode != 0
    assert f"pcp data prepare INPUT --tokenizer {gpt2_folder} -o DATA" in result.stderr
    assert "Traceback" not in result.stderr
