"""The export cache: a program built again from the same things is read, not exported;
anything it is built from, changed, exports anew; a damaged entry is never used."""

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from pcp_core import plugins
from pcp_core.data import text as data
from pcp_core.program import export_cache
from pcp_core.program.build import build_train_program
from pcp_core.testing.reference import REFERENCE_MODEL, reference_settings


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("PCP_CACHE_DIR", str(directory))
    return directory


@pytest.fixture
def exports(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The functions jax.export has exported since the test began, by name."""
    import jax

    seen: list[str] = []
    real = jax.export.export

    def counting(function: Any, **options: Any) -> Any:
        seen.append(getattr(function, "__name__", repr(function)))
        return real(function, **options)

    monkeypatch.setattr(jax.export, "export", counting)
    return seen


def build(**overrides: int) -> Any:
    host = plugins.host()
    model, optimizer = host.model("nanogpt"), host.optimizer("adamw")
    vocab = data.load_text_file(None).vocab_size
    config = model.config({**REFERENCE_MODEL, **overrides, "vocab_size": vocab})
    settings = reference_settings(optimizer)
    identity = export_cache.identity(model, optimizer, config, settings)
    return build_train_program(model, config, optimizer.build(settings), 2, 4, identity=identity)


def test_the_same_program_is_read_back_not_exported(cache: Path, exports: list[str]) -> None:
    first = build()
    assert len(exports) == 1 and len(list(cache.glob("*.mlir"))) == 1
    again = build()
    assert len(exports) == 1, "exported again although the cache holds the program"
    assert again.stablehlo == first.stablehlo
    assert again.param_specs == first.param_specs and again.opt_specs == first.opt_specs


def test_another_model_setting_exports_anew(cache: Path, exports: list[str]) -> None:
    """n_head leaves every tensor's shape as it is, yet changes the program."""
    two_heads, four_heads = build(n_head=2), build(n_head=4)
    assert len(exports) == 2 and len(list(cache.glob("*.mlir"))) == 2
    assert two_heads.stablehlo != four_heads.stablehlo


def test_the_unrolled_form_is_cached_beside_the_loop(cache: Path, exports: list[str]) -> None:
    unrolled = build().stablehlo_for(unrolled=True)
    assert build().stablehlo_for(unrolled=True) == unrolled
    assert len(exports) == 2 and len(list(cache.glob("*.mlir"))) == 2


def test_a_damaged_entry_is_exported_again(cache: Path, exports: list[str]) -> None:
    honest = build().stablehlo
    (entry,) = cache.glob("*.mlir")
    entry.write_text(honest.replace("main", "evil"))
    assert build().stablehlo == honest
    assert len(exports) == 2


def test_a_cache_others_can_write_is_not_used(cache: Path, exports: list[str]) -> None:
    cache.chmod(0o777)
    build(), build()
    assert len(exports) == 2 and not list(cache.glob("*.mlir"))


def test_an_edited_source_file_changes_the_key(tmp_path: Path) -> None:
    package = tmp_path / "pcp_export_probe"
    package.mkdir()
    (package / "__init__.py").write_text("STEP = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.import_module("pcp_export_probe")
        before = export_cache._source_digest("pcp_export_probe")
        (package / "__init__.py").write_text("STEP = 2\n")
        export_cache._source_digest.cache_clear()
        assert export_cache._source_digest("pcp_export_probe") != before
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("pcp_export_probe", None)
        export_cache._source_digest.cache_clear()


def test_the_key_holds_jax_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    host = plugins.host()
    model, optimizer = host.model("nanogpt"), host.optimizer("adamw")
    settings = reference_settings(optimizer)
    plain = export_cache.identity(model, optimizer, REFERENCE_MODEL, settings)
    monkeypatch.setenv("JAX_ENABLE_X64", "1")
    assert export_cache.identity(model, optimizer, REFERENCE_MODEL, settings) != plain
