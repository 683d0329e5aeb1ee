"""`pcp export`: a run's trained model as a file that other runtimes load.

The exported function is the model plugin's own forward pass in float32: token ids
[batch, time] (int32) to logits [batch, time, vocabulary] (float32), with the batch and
the time dynamic (time at most the block size) and the parameters held inside as
constants. Two formats:

- `onnx`: converted by jax2onnx, for onnxruntime and the runtimes that load ONNX
  (WASI-NN's backends among them); input `tokens`, output `logits`.
- `stablehlo`: the module jax.export makes (MLIR text, function `main`), for users who
  bring their own compiler.
- `iree`: the cached sampler's `prefill` and `decode` step functions (a key/value cache,
  one position a token: `pcp_core.program.decoding`), compiled for an IREE backend
  without its hardware (`pcp_core.iree.inference`), the parameters in a file beside.
- `huggingface`: a folder that `transformers` loads (`GPT2LMHeadModel.from_pretrained`,
  `AutoTokenizer.from_pretrained`): the built-in model is GPT-2's architecture
  (`pcp_core.program.huggingface`). The folder is the whole export.

Beside the file go the run's tokenizer as a Hugging Face `tokenizer.json`
(`<name>.tokenizer.json`: the `tokenizers` library, in Python, Rust or JavaScript, loads
it; PCP's chars and bytes tokenizers are written as BPEs without merges that give the
same ids) and a small metadata file per format (`<name>.<format>.metadata.json`:
vocabulary size, block size, model, the run and step it came from), so the file is
usable on its own and the exports of several formats share a folder.
"""

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from pcp_core.data import tokenizers
from pcp_core.program import trained
from pcp_core.program.build import without_locations

log = structlog.get_logger(__name__)

FORMATS = ("onnx", "stablehlo", "iree", "huggingface")
INPUT, OUTPUT = "tokens", "logits"
ONNX_OPSET = 21  # onnxruntime 1.17 and later run it


class ExportError(ValueError):
    """Bad input to `pcp export`, shown as one line."""


def export(
    run_dir: Path,
    format: str,
    out: Path,
    plugins: trained.ModelLookup,
    iree_modules: Callable[[trained.TrainedModel, Path], tuple[list[Path], dict[str, Any]]]
    | None = None,
) -> list[Path]:
    """Write `run_dir`'s model to `out` in `format`, with its tokenizer and metadata
    beside it; the paths written. `iree` needs `iree_modules`, a backend's compiler
    (`pcp_core.iree.inference.module_writer`): the files it wrote and their metadata."""
    if format not in FORMATS:
        raise ExportError(f"unknown format {format!r}; known: {', '.join(FORMATS)}")
    if (format == "iree") != (iree_modules is not None):
        raise ExportError("--backend is for --format iree, and --format iree needs it")
    run = trained.load(Path(run_dir), plugins)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log.info("exporting", model=run.model.name, step=run.metadata.get("step"), format=format)
    if format == "huggingface":
        return huggingface_folder(run, out)
    written: list[Path] = [out]
    described: dict[str, Any] = {}
    if format == "onnx":
        write_onnx(forward_pass(run), run.config["block_size"], out)
    elif format == "stablehlo":
        out.write_text(stablehlo(forward_pass(run), run.config["block_size"]))
    elif iree_modules is not None:
        written, described = iree_modules(run, out)
    tokenizer_path = beside(out, "tokenizer.json")
    tokenizers.hugging_face_tokenizer(run.tokenizer).save(str(tokenizer_path))
    metadata_path = beside(out, f"{format}.metadata.json")
    about = metadata(run, format, run_dir, tokenizer_path) | described
    metadata_path.write_text(json.dumps(about, indent=2))
    return [*written, tokenizer_path, metadata_path]


def huggingface_folder(run: trained.TrainedModel, out: Path) -> list[Path]:
    """The run's model as a `transformers` GPT-2 folder; ExportError for another model."""
    from pcp_core.program import huggingface

    if run.model.name != "nanogpt":
        raise ExportError(f"--format huggingface writes GPT-2 (nanogpt), not {run.model.name!r}")
    if out.exists() and not out.is_dir():
        raise ExportError(f"--format huggingface writes a folder; {out} is a file")
    return huggingface.write(out, dict(run.params), run.config, run.tokenizer)


def beside(out: Path, suffix: str) -> Path:
    """`model.onnx` -> `model.<suffix>` in the same directory."""
    return out.with_name(f"{out.name.split('.')[0]}.{suffix}")


def forward_pass(run: trained.TrainedModel) -> Callable[[Any], Any]:
    """tokens [batch, time] -> logits [batch, time, vocabulary], in float32, with the
    run's parameters as constants."""
    import jax.numpy as jnp

    logits_of, config = run.model.logits, run.config
    if logits_of is None:  # (trained.load has checked)
        raise ExportError(f"model {run.model.name!r} has no logits function to export")
    params = {name: jnp.asarray(value, jnp.float32) for name, value in run.params.items()}

    def forward(tokens: Any) -> Any:
        return logits_of(config, params, tokens).astype(jnp.float32)

    return forward


def token_spec(block_size: int) -> Any:
    """int32 [batch, time], both dynamic, time at most `block_size`."""
    import jax
    import jax.numpy as jnp

    shape = jax.export.symbolic_shape("batch, time", constraints=[f"time <= {block_size}"])
    return jax.ShapeDtypeStruct(shape, jnp.int32)


def write_onnx(forward: Callable[[Any], Any], block_size: int, out: Path) -> None:
    try:
        from jax2onnx import to_onnx
    except ImportError:
        raise ExportError("--format onnx needs jax2onnx: pip install 'pcp-core[export]'") from None
    # onnx_ir warns once per shape constant it cannot type; the model is complete
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    to_onnx(
        forward,
        [token_spec(block_size)],
        model_name="pcp",
        opset=ONNX_OPSET,
        input_names=[INPUT],
        output_names=[OUTPUT],
        return_mode="file",
        output_path=str(out),
    )


def stablehlo(forward: Callable[[Any], Any], block_size: int) -> str:
    """The forward pass as StableHLO text, exported by jax.export with f32 products at
    full precision (as PCP's training programs are)."""
    import jax

    with jax.default_matmul_precision("highest"):
        exported = jax.export.export(jax.jit(forward))(token_spec(block_size))
    return without_locations(exported.mlir_module())


def metadata(
    run: trained.TrainedModel, format: str, run_dir: Path, tokenizer_path: Path
) -> dict[str, Any]:
    """What a runtime needs beside the file: the shapes, the vocabulary and the source."""
    return {
        "format": format,
        "input": {"name": INPUT, "dtype": "int32", "shape": ["batch", "time"]},
        "output": {"name": OUTPUT, "dtype": "float32", "shape": ["batch", "time", "vocab"]},
        "vocab_size": run.config["vocab_size"],
        "block_size": run.config["block_size"],
        "tokenizer": tokenizer_path.name,
        "model": run.model.name,
        "model_config": run.config,
        "run_dir": str(Path(run_dir).resolve()),
        "step": int(run.metadata["step"]) if "step" in run.metadata else None,
    }
