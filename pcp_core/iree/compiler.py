"""Compiling StableHLO to an IREE VMFB for a backend, kept in PCP's compile cache.

The cache key covers the program text, the target, the flags and the IREE compiler
version, so a changed program or toolchain never reuses a stale module. The cache is
used only while it is private (`pcp_core.compile_cache`). Each module `<key>.vmfb` has
`<key>.json` beside it, holding the key and the module's sha256; an entry without one
(left by someone or something else) or whose module does not match it is recompiled.
"""

import hashlib
import json
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Protocol, cast

import structlog

from pcp_core import compile_cache
from pcp_core.backends import Backend, CompileError
from pcp_core.interrupts import import_holding_ctrl_c
from pcp_core.iree.compile_process import CompilerFailed, CompilerHung, compile_stablehlo

log = structlog.get_logger(__name__)

COMPILER_DISTRIBUTION = "iree-base-compiler"
RUNTIME_DISTRIBUTION = "iree-base-runtime"


class IreeTarget(Protocol):
    """What compiling reads of an IREE backend's runtime (`pcp_core.iree.runtime.IreeRuntime`)."""

    @property
    def target(self) -> str: ...

    def compile_flags(self, arch: str) -> list[str]: ...


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


def _cached_module(directory: Path, key: str) -> bytes | None:
    """The module cached under `key`, if there is one and it matches its digest."""
    module, digest = directory / f"{key}.vmfb", directory / f"{key}.json"
    try:
        vmfb = module.read_bytes()
    except OSError:
        return None  # none there, or trimmed meanwhile by another process
    try:
        record = json.loads(digest.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if module.exists():  # else both went in a trim meanwhile
            log.warning(
                "compile cache entry has no digest (not written by PCP); recompiling",
                path=str(module),
            )
        return None
    except (OSError, ValueError) as error:
        log.warning(
            "compile cache digest unreadable; recompiling", path=str(digest), reason=str(error)
        )
        return None
    expected = {"key": key, "vmfb_sha256": hashlib.sha256(vmfb).hexdigest()}
    if not isinstance(record, dict) or any(record.get(k) != v for k, v in expected.items()):
        log.warning(
            "compile cache entry does not match its digest (tampered or corrupt); recompiling",
            path=str(module),
        )
        return None
    compile_cache.mark_used(digest)
    return vmfb


def _store_module(directory: Path, key: str, vmfb: bytes, description: dict[str, str]) -> None:
    """Cache `vmfb` under `key`; its digest is written last, so it marks a whole entry."""
    record = {"key": key, "vmfb_sha256": hashlib.sha256(vmfb).hexdigest(), **description}
    record_bytes = json.dumps(record, indent=1).encode()
    compile_cache.store(directory, [(f"{key}.vmfb", vmfb), (f"{key}.json", record_bytes)])


def flags_for_key(flags: list[str]) -> list[str]:
    """`flags` as the cache key holds them: a `--flag=PATH` naming a file (a tuning
    spec, say) by the file's sha256, not its path. Editing such a file recompiles; the
    same plugin installed elsewhere (another venv, a worker's checkout) hits the cache.
    Only absolute paths count: a value such as `sm_80` stays itself even where a file
    of that name happens to be in the working directory."""
    keyed = []
    for flag in flags:
        name, _, value = flag.partition("=")
        path = Path(value)
        if path.is_absolute() and path.is_file():
            flag = f"{name}=sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
        keyed.append(flag)
    return keyed


def compile_program(stablehlo: str, backend: Backend, arch: str) -> CompiledProgram:
    """The VMFB for `stablehlo` on `backend` (an IREE one: its runtime is an IreeRuntime,
    whose target and flags are used) and `arch`, from the cache when it is there."""
    target = cast(IreeTarget, backend.runtime)  # an IreeRuntime, as the docstring says
    flags = target.compile_flags(arch)
    version = iree_compiler_version()
    key_material = "\0".join([stablehlo, target.target, *flags_for_key(flags), version])
    key = hashlib.sha256(key_material.encode()).hexdigest()
    directory = compile_cache.private_cache_dir()
    vmfb = _cached_module(directory, key) if directory else None
    if vmfb is not None:
        assert directory is not None  # a cached module was read from it
        log.info(
            "compile cache hit, not compiling",
            backend=backend.name,
            arch=arch,
            path=str(directory / f"{key}.vmfb"),
        )
        return CompiledProgram(vmfb, hashlib.sha256(vmfb).hexdigest(), backend.name, arch, True)

    try:
        import_holding_ctrl_c("iree.compiler")  # loaded here, so a missing one is said clearly
    except ImportError:
        raise CompileError(
            f"no IREE compiler here to compile for {backend.name}: "
            f"pip install {COMPILER_DISTRIBUTION}=={iree_runtime_version()}"
        ) from None

    log.info("compiling with IREE", backend=backend.name, target=target.target, arch=arch)
    started = time.perf_counter()
    try:
        vmfb = compile_stablehlo(stablehlo, target.target, flags)
    except (CompilerFailed, CompilerHung) as error:
        first_error = next((ln for ln in str(error).splitlines() if "error:" in ln), str(error))
        raise CompileError(
            f"IREE {version} failed to compile for {backend.name} ({arch}): {first_error.strip()}"
        ) from error
    seconds = time.perf_counter() - started
    log.info(
        "compiled", backend=backend.name, arch=arch, seconds=round(seconds, 1), bytes=len(vmfb)
    )
    if directory:
        about = {"backend": backend.name, "target": target.target, "arch": arch}
        _store_module(directory, key, vmfb, {**about, "iree_compiler": version})
    return CompiledProgram(vmfb, hashlib.sha256(vmfb).hexdigest(), backend.name, arch, False)
