"""`pcp export`: a trained run as ONNX that onnxruntime runs as PCP does, as StableHLO,
and as IREE modules with a key/value cache; its tokenizer and metadata beside it;
one-line errors."""

import json
from pathlib import Path

import numpy as np
import pytest

from pcp_core import plugins
from pcp_core.data import tokenizers
from pcp_core.program import trained
from tests.conftest import run_pcp

PROMPT = "The "


@pytest.fixture(scope="module")
def onnx_file(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "model.onnx"
    result = run_pcp("export", str(trained_run), "--format", "onnx", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}" in result.stdout
    return out


@pytest.fixture(scope="module")
def session(onnx_file: Path):
    import onnxruntime

    return onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])


def pcp_logits(run_dir: Path, tokens: np.ndarray) -> np.ndarray:
    """PCP's own forward pass (the model plugin's logits), in float32 on the CPU."""
    import jax.numpy as jnp

    run = trained.load(run_dir, plugins.host())
    assert run.model.logits is not None
    return np.asarray(run.model.logits(run.config, run.params, jnp.asarray(tokens)))


@pytest.mark.parametrize("shape", [(1, 7), (3, 64)])
def test_onnx_logits_match_pcps(trained_run: Path, session, shape: tuple[int, int]) -> None:
    """Two batch and sequence sizes through the one file: both axes are dynamic."""
    vocab = trained.load(trained_run, plugins.host()).config["vocab_size"]
    tokens = np.random.default_rng(0).integers(0, vocab, shape).astype(np.int32)
    (logits,) = session.run(["logits"], {"tokens": tokens})
    assert logits.shape == (*shape, vocab) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, pcp_logits(trained_run, tokens), rtol=0, atol=1e-4)


def test_onnx_greedy_text_is_pcp_samples(trained_run: Path, session, onnx_file: Path) -> None:
    """100 greedy tokens (past the 64-token block) read with the exported tokenizer and
    metadata alone: the text `pcp sample --top-k 1` gives."""
    tokenizer = tokenizers.load_tokenizer_file(onnx_file.with_name("model.tokenizer.json"))
    block = json.loads(onnx_file.with_name("model.onnx.metadata.json").read_text())["block_size"]
    ids = [int(i) for i in tokenizer.encode(PROMPT)]
    for _ in range(100):
        context = np.asarray([ids[-block:]], np.int32)
        (logits,) = session.run(["logits"], {"tokens": context})
        ids.append(int(np.argmax(logits[0, -1])))
    result = run_pcp(
        "sample", str(trained_run), "--prompt", PROMPT, "--tokens", "100", "--top-k", "1"
    )
    assert result.returncode == 0, result.stderr
    assert tokenizer.decode(np.asarray(ids)) + "\n" == result.stdout


def test_metadata_names_the_run(trained_run: Path, onnx_file: Path) -> None:
    metadata = json.loads(onnx_file.with_name("model.onnx.metadata.json").read_text())
    run = trained.load(trained_run, plugins.host())
    assert metadata["format"] == "onnx" and metadata["step"] == 60
    assert metadata["run_dir"] == str(trained_run.resolve())
    assert metadata["vocab_size"] == run.config["vocab_size"] == run.tokenizer.vocab_size
    assert metadata["block_size"] == run.config["block_size"] == 64
    assert metadata["tokenizer"] == "model.tokenizer.json"
    # a real Hugging Face tokenizer file, with PCP's ids
    from tokenizers import Tokenizer

    hugging_face = Tokenizer.from_file(str(onnx_file.with_name("model.tokenizer.json")))
    assert hugging_face.encode(PROMPT).ids == [int(i) for i in run.tokenizer.encode(PROMPT)]


def test_stablehlo_parses_with_dynamic_batch_and_time(trained_run: Path, tmp_path: Path) -> None:
    from jax.interpreters import mlir

    out = tmp_path / "model.stablehlo.mlir"
    result = run_pcp("export", str(trained_run), "--format", "stablehlo", "-o", str(out))
    assert result.returncode == 0, result.stderr
    vocab = trained.load(trained_run, plugins.host()).config["vocab_size"]
    with mlir.make_ir_context():
        module = mlir.ir.Module.parse(out.read_text())
        main = next(op for op in module.body.operations if op.name.value == "main")
        signature = str(main.type)
    assert signature == f"(tensor<?x?xi32>) -> tensor<?x?x{vocab}xf32>"
    assert (tmp_path / "model.tokenizer.json").exists()
    metadata = json.loads((tmp_path / "model.stablehlo.metadata.json").read_text())
    assert metadata["format"] == "stablehlo"


def test_iree_modules_run_on_their_own(trained_run: Path, tmp_path: Path) -> None:
    """The exported modules, loaded with the IREE runtime alone and given the exported
    parameters and a zero cache as the metadata says: PCP's logits after a prefill of the
    prompt's window and after one decoded token."""
    import iree.runtime as rt
    from safetensors.numpy import load_file

    result = run_pcp(
        "export", str(trained_run), "--format", "iree", "--backend", "cpu", "-o",
        str(tmp_path / "model.vmfb"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "model.iree.metadata.json").read_text())
    assert meta["format"] == "iree" and meta["backend"] == "cpu" and meta["driver"] == "local-task"
    params = load_file(tmp_path / meta["parameters"])
    context = rt.SystemContext(config=rt.Config(meta["driver"]))
    for name in meta["modules"].values():
        context.add_vm_module(
            rt.VmModule.copy_buffer(context.instance, (tmp_path / name).read_bytes())
        )
    prefill = context.modules.jit_prefill[meta["function"]]
    decode = context.modules.jit_decode[meta["function"]]
    weights = [params[name] for name in meta["parameter_order"]]
    cache = np.zeros(meta["cache_shape"], np.float32)
    tokens = np.random.default_rng(0).integers(0, meta["vocab_size"], (1, 11)).astype(np.int32)
    window = np.zeros((1, meta["block_size"]), np.int32)
    window[0, :10] = tokens[0, :10]
    logits, cache = prefill(*weights, cache, window, np.int32(0), np.int32(9))
    expected = pcp_logits(trained_run, tokens)[0]
    np.testing.assert_allclose(logits.to_host(), expected[9], rtol=0, atol=1e-4)
    logits, cache = decode(*weights, cache, tokens[:, 10:], np.int32(10), np.int32(0))
    np.testing.assert_allclose(logits.to_host(), expected[10], rtol=0, atol=1e-4)


@pytest.mark.parametrize("backend", ["cuda", "rocm", "metal", "vulkan"])
def test_iree_modules_compile_without_the_hardware(trained_run: Path, backend: str) -> None:
    """For every IREE backend, as `pcp compile` does: its default architecture, no device."""
    from pcp_core import plugins
    from pcp_core.iree.inference import compile_steps

    run = trained.load(trained_run, plugins.host())
    chosen = plugins.host().backend(backend)
    vmfbs = compile_steps(run.model, run.config, chosen, chosen.default_arch)
    assert set(vmfbs) == {"prefill", "decode"} and all(vmfbs.values())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}", "--format", "onnx"], "no such run directory"),
        (["{empty}", "--format", "onnx"], "no checkpoint"),
        (["{run}", "--format", "tflite"], "unknown format 'tflite'; known: onnx, stablehlo, iree"),
        (["{run}", "--format", "iree"], "--format iree needs it"),
        (["{run}", "--format", "onnx", "--backend", "cpu"], "--backend is for --format iree"),
        (["{run}", "--format", "iree", "--backend", "xla"], "'xla' does not run IREE modules"),
        (["{run}", "--format", "iree", "--backend", "tpu-v9"], "tpu-v9"),
        (["{run}", "--format", "iree", "--target", "sm_90"], "give --backend too"),
    ],
)
def test_bad_input_is_one_line(
    trained_run: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    places = {"missing": tmp_path / "nowhere", "empty": tmp_path, "run": trained_run}
    out = ["-o", str(tmp_path / "model.onnx")]
    result = run_pcp("export", *(arg.format(**places) for arg in args), *out)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "model.onnx").exists()
