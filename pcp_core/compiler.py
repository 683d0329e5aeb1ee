"""Compiling StableHLO to an IREE VMFB for a backend, with an on-disk cache.

The cache key covers the program text, the target, the flags and the IREE compiler
version, so a changed program or toolchain never reuses a stale module.
"""

import hashlib
import os
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import structlog

from pcp_core.backends import Backend

log = structlog.get_logger(__name__)

COMPILER_DISTRIBUTION = "iree-base-compiler"
RUNTIME_DISTRIBUTION = "iree-base-runtime"


class CompileError(RuntimeError):
    """IREE could not compile the program for a target."""


@dataclass(frozen=True)
class CompiledProgram:
    vmfb: bytes
    sha256: str
    backend: str
    arch: str
    cache_hit: bool


def iree_compiler_version() -> str:
    """The IREE version programs are compiled with here.

    Where no compiler is installed this is the runtime's version (both are pinned to
    the same protocol version): such a machine can still serve programs from its cache.
    """
    try:
        return metadata.version(COMPILER_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return iree_runtime_version()


def iree_runtime_version() -> str:
    return metadata.version(RUNTIME_DISTRIBUTION)


def cache_dir() -> Path:
    override = os.environ.get("PCP_CACHE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("pcp")) / "vmfb"


def named_file_digests(flags: list[str]) -> list[str]:
    """The sha256 of each file a `--flag=PATH` names (a tuning spec, say).

    The cache key holds these as well as the flags, so editing such a file recompiles.
    """
    values = (flag.partition("=")[2] for flag in flags)
    files = [Path(value) for value in values if value and Path(value).is_file()]
    return [hashlib.sha256(path.read_bytes()).hexdigest() for path in files]


def compile_program(stablehlo: str, backend: Backend, arch: str) -> CompiledProgram:
    """The VMFB for `stablehlo` on `backend`/`arch`, from the cache when it is there."""
    flags = backend.compile_flags(arch)
    version = iree_compiler_version()
    digests = named_file_digests(flags)
    key_material = "\0".join([stablehlo, backend.target, *flags, *digests, version])
    key = hashlib.sha256(key_material.encode()).hexdigest()
    path = cache_dir() / f"{key}.vmfb"
    if path.is_file():
        vmfb = path.read_bytes()
        log.info(
            "compile cache hit, not compiling", backend=backend.name, arch=arch, path=str(path)
        )
        return CompiledProgram(vmfb, hashlib.sha256(vmfb).hexdigest(), backend.name, arch, True)

    try:
        import iree.compiler
    except ImportError:
        raise CompileError(
            f"no IREE compiler here to compile for {backend.name}: "
            f"pip install {COMPILER_DISTRIBUTION}=={iree_runtime_version()}"
        ) from None

    log.info("compiling with IREE", backend=backend.name, target=backend.target, arch=arch)
    started = time.perf_counter()
    try:
        vmfb = iree.compiler.compile_str(
            stablehlo,
            target_backends=[backend.target],
            input_type="stablehlo",
            extra_args=flags,
        )
    except iree.compiler.CompilerToolError as error:
        first_error = next((ln for ln in str(error).splitlines() if "error:" in ln), str(error))
        raise CompileError(
            f"IREE {version} failed to compile for {backend.name} ({arch}): {first_error.strip()}"
        ) from error
    seconds = time.perf_counter() - started
    log.info(
        "compiled", backend=backend.name, arch=arch, seconds=round(seconds, 1), bytes=len(vmfb)
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_bytes(vmfb)
    partial.replace(path)  # atomic: a crash never leaves a truncated module in the cache
    return CompiledProgram(vmfb, hashlib.sha256(vmfb).hexdigest(), backend.name, arch, False)
