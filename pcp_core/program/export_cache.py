"""The exported StableHLO of a program, cached beside the compiled modules.

Tracing a step through jax and exporting it costs time each time a shepherd, `pcp
train` or `pcp compile` starts (1.0 of a tiny local run's 5.2 CPU-s on a CI core; 1.5 s
of GPT-2 small's start on an H100 machine's CPU), although the text only changes with
what it is built from. An entry is
keyed by all of that: the model and its configuration, the inner optimizer and its
settings (the schedule among them: a program that carries it as state exports the same
text for each, and so compiles once, but an optimizer could bake it), the tensors' shapes and
dtypes, the precision, the jax and jaxlib versions, the `JAX_*` environment settings,
and the source of every file of pcp-core and of the packages the model and optimizer
come from. An edited file, another setting or another jax exports anew.

The entries sit in the compile cache's directory and are trusted as far as it is (see
`pcp_core.compile_cache`): private to this user, else not used. Each `<key>.mlir` has
`<key>.mlir.json` beside it with the key and the text's sha256, written last.
"""

import functools
import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from pcp_core import compile_cache

log = structlog.get_logger(__name__)


def identity(model: Any, optimizer: Any, model_config: Mapping[str, Any], settings: Any) -> dict:
    """What a program built from `model`, `optimizer` (the plugins' objects) and their
    settings depends on beyond its shapes, for `stablehlo`'s key."""
    import jax
    import jaxlib

    packages = sorted({_package_of(model), _package_of(optimizer), "pcp_core"})
    return {
        "model": f"{type(model).__module__}.{type(model).__qualname__}",
        "model_config": dict(model_config),
        "optimizer": f"{type(optimizer).__module__}.{type(optimizer).__qualname__}",
        "settings": repr(settings),
        "jax": [jax.__version__, jaxlib.__version__],
        "jax_environment": sorted((k, v) for k, v in os.environ.items() if k.startswith("JAX_")),
        "code": {package: _source_digest(package) for package in packages},
    }


def stablehlo(key_parts: Mapping[str, Any] | None, export: Callable[[], str]) -> str:
    """`export()`'s text, from the cache where an entry has the key of `key_parts` (an
    `identity` plus the program's shapes); with `key_parts` None, exported every time."""
    if key_parts is None:
        return export()
    directory = compile_cache.private_cache_dir()
    if directory is None:
        return export()
    material = json.dumps(key_parts, sort_keys=True, default=repr)
    key = hashlib.sha256(material.encode()).hexdigest()
    text = _cached(directory, key)
    if text is not None:
        log.debug("export cache hit, not exporting", path=str(directory / f"{key}.mlir"))
        return text
    text = export()
    _store(directory, key, text)
    return text


def _package_of(instance: Any) -> str:
    return type(instance).__module__.split(".")[0]


@functools.cache
def _source_digest(package: str) -> str:
    """The sha256 of every .py file of `package`, with its path inside the package."""
    folders = getattr(sys.modules[package], "__path__", None)
    if not folders:  # a single-module plugin
        files = [Path(sys.modules[package].__file__ or "")]
        roots = [files[0].parent]
    else:
        roots = [Path(folder) for folder in folders]
        files = sorted(f for root in roots for f in root.rglob("*.py"))
    digest = hashlib.sha256()
    for file in files:
        root = next(r for r in roots if file.is_relative_to(r))
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def _cached(directory: Path, key: str) -> str | None:
    text_path, record_path = directory / f"{key}.mlir", directory / f"{key}.mlir.json"
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        data = text_path.read_bytes()
    except (OSError, ValueError):
        return None  # no entry, or one not yet whole: export again
    expected = {"key": key, "sha256": hashlib.sha256(data).hexdigest()}
    if not isinstance(record, dict) or any(record.get(k) != v for k, v in expected.items()):
        log.warning("export cache entry does not match its digest; exporting", path=str(text_path))
        return None
    compile_cache.mark_used(record_path)
    return data.decode()


def _store(directory: Path, key: str, text: str) -> None:
    data = text.encode()
    record = {"key": key, "sha256": hashlib.sha256(data).hexdigest()}
    compile_cache.store(
        directory, [(f"{key}.mlir", data), (f"{key}.mlir.json", json.dumps(record).encode())]
    )
