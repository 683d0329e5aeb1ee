"""GPT-2 checkpoints in Hugging Face's format, in (`--init-from`) and out (`pcp export
--format huggingface`).

PCP's built-in model (`nanogpt`) is GPT-2's architecture with GPT-2's parameter names
and layouts: pre-norm blocks, a tanh-GELU MLP four times as wide, LayerNorm eps 1e-5,
tied embeddings, and weights stored input × output as GPT-2's `Conv1D` stores them. A
`transformers` GPT-2 directory (what `save_pretrained` writes and the hub serves:
`config.json`, `model.safetensors` or `pytorch_model.bin`, and the tokenizer's files)
therefore maps onto it key for key, under a `transformer.` prefix; the causal-mask
buffers of older checkpoints are dropped, and an output layer not tied to the
embeddings is refused, as is any setting the built-in model does not have.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from pcp_core.config import ConfigError
from pcp_core.data import tokenizers
from pcp_core.data.errors import DataError

log = structlog.get_logger(__name__)

PREFIX = "transformer."
SAFETENSORS, PYTORCH = "model.safetensors", "pytorch_model.bin"
# config.json values the built-in model has; any other is refused, naming it
REQUIRED = {
    "model_type": "gpt2",
    "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "tie_word_embeddings": True,
}
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")
BUFFERS = (".attn.bias", ".attn.masked_bias")  # older checkpoints' causal masks


@dataclass(frozen=True)
class Pretrained:
    """A checkpoint as the built-in model's settings, parameters (float32, PCP's names)
    and tokenizer (None where the directory holds none)."""

    model_config: dict[str, int]
    params: dict[str, np.ndarray]
    tokenizer: tokenizers.Tokenizer | None
    source: str


def read(directory: Path) -> Pretrained:
    """The GPT-2 checkpoint in `directory`; ConfigError, one line, for what does not map."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"--init-from {directory}: no such folder")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"--init-from {directory}: no config.json (a Hugging Face model folder)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"--init-from {config_path}: unreadable: {error}") from None
    model_config = gpt2_settings(config, directory)
    params = _renamed(_tensors(directory), directory)
    try:
        tokenizer = tokenizers.load_tokenizer_dir(directory)
    except DataError as error:
        log.warning("the checkpoint's tokenizer is not usable", error=str(error))
        tokenizer = None
    return Pretrained(model_config, params, tokenizer, str(directory))


def gpt2_settings(config: dict[str, Any], directory: Path) -> dict[str, int]:
    """The built-in model's settings of a GPT-2 `config.json`."""
    for key, wanted in REQUIRED.items():
        value = config.get(key, wanted)
        if value != wanted:
            raise ConfigError(
                f"--init-from {directory}: {key} is {value!r}; the built-in model has {wanted!r}"
            )
    activation = config.get("activation_function", "gelu_new")
    if activation not in TANH_GELU:
        raise ConfigError(
            f"--init-from {directory}: activation {activation!r}; the built-in model has "
            "GELU's tanh form (gelu_new)"
        )
    width: Any = config.get("n_embd")  # a JSON value, or None (int(None): TypeError below)
    if config.get("n_inner") not in (None, 4 * (width or 0)):
        raise ConfigError(f"--init-from {directory}: an MLP of {config['n_inner']}, not 4 × width")
    try:
        return {
            "n_layer": int(config["n_layer"]),
            "n_head": int(config["n_head"]),
            "n_embd": int(width),
            "block_size": int(config["n_positions"]),
            "vocab_size": int(config["vocab_size"]),
        }
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(f"--init-from {directory}: config.json lacks {error}") from None


def _tensors(directory: Path) -> dict[str, np.ndarray]:
    if (directory / SAFETENSORS).is_file():
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            return load_file(str(directory / SAFETENSORS))
        except (SafetensorError, OSError, TypeError, ValueError) as error:
            raise ConfigError(f"--init-from {directory / SAFETENSORS}: {error}") from None
    if (directory / PYTORCH).is_file():
        try:
            import torch
        except ImportError:
            raise ConfigError(
                f"--init-from {directory}: {PYTORCH} needs torch to read; install torch, or "
                f"save the model again with safe_serialization (it writes {SAFETENSORS})"
            ) from None
        state = torch.load(directory / PYTORCH, map_location="cpu", weights_only=True)
        return {name: value.float().numpy() for name, value in state.items()}
    raise ConfigError(f"--init-from {directory}: neither {SAFETENSORS} nor {PYTORCH}")


def _renamed(tensors: dict[str, np.ndarray], directory: Path) -> dict[str, np.ndarray]:
    """PCP's names (the prefix off), float32; the tied output layer and masks left out."""
    params = {}
    for key, value in tensors.items():
        name = key.removeprefix(PREFIX)
        if name.endswith(BUFFERS):
            continue
        if name == "lm_head.weight":
            embeddings = tensors.get(PREFIX + "wte.weight", tensors.get("wte.weight"))
            if embeddings is None or not np.array_equal(value, embeddings):
                raise ConfigError(
                    f"--init-from {directory}: its output layer is not tied to the embeddings"
                )
            continue
        if name in ("wte.weight", "wpe.weight"):
            name = name.removesuffix(".weight")
        params[name] = np.asarray(value, dtype=np.float32)
    return params


def fitted(pretrained: Pretrained, expected: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The parameters in the built-in model's order and shapes (`expected`); the position
    table cut to a shorter block size. ConfigError for a missing or misshapen tensor."""
    params = {}
    for name, shape in expected.items():
        value = pretrained.params.get(name)
        if value is not None and name == "wpe" and value.shape[0] >= shape[0]:
            value = value[: shape[0]]
        if value is None or value.shape != shape:
            found = "missing" if value is None else f"shaped {value.shape}"
            raise ConfigError(
                f"--init-from {pretrained.source}: {name} is {found}; the model needs {shape}"
            )
        params[name] = np.ascontiguousarray(value)
    unused = sorted(set(pretrained.params) - set(expected))
    if unused:
        raise ConfigError(f"--init-from {pretrained.source}: tensors the model lacks: {unused[:3]}")
    return params


def write(
    out: Path, params: dict[str, np.ndarray], model_config: dict[str, int], tokenizer: Any
) -> list[Path]:
    """A folder `GPT2LMHeadModel.from_pretrained` and `AutoTokenizer.from_pretrained` load:
    config.json, model.safetensors and the tokenizer; the paths written."""
    from safetensors.numpy import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # GPT-2's end-of-text token where the vocabulary has one; else none (transformers'
    # default, 50256, lies outside a smaller vocabulary)
    end = tokenizers.hugging_face_tokenizer(tokenizer).token_to_id("<|endoftext|>")
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": model_config["vocab_size"],
        "n_positions": model_config["block_size"],
        "n_embd": model_config["n_embd"],
        "n_layer": model_config["n_layer"],
        "n_head": model_config["n_head"],
        "n_inner": None,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": True,
        "bos_token_id": end,
        "eos_token_id": end,
        "torch_dtype": "float32",
    }
    tensors = {}
    for name, value in params.items():
        key = name + ".weight" if name in ("wte", "wpe") else name
        tensors[PREFIX + key] = np.ascontiguousarray(value, dtype=np.float32)
    written = [out / "config.json", out / SAFETENSORS]
    written[0].write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(written[1]), metadata={"format": "pt"})
    return written + tokenizers.write_tokenizer_dir(tokenizer, out, model_config["block_size"])
