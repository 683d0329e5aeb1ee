"""The compile cache is private and checked: an entry is used only if this user's
directory holds it, no one else can write there, and it matches its digest."""

import json
import os
import stat
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from pcp_core.iree.compiler import compile_program, flags_for_key, unsafe_cache_dir_reason

# Compiles in well under a second, unlike a train program.
DOUBLE = """func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}"""


def compile_double(logged: list | None = None):
    """Compile DOUBLE for the CPU, adding the log events to `logged`."""
    import pcp_cpu

    with capture_logs() as events:
        compiled = compile_program(DOUBLE, pcp_cpu.CPU, "x86-64")
    if logged is not None:
        logged.extend(events)
    return compiled


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "made-by-pcp" / "vmfb"
    monkeypatch.setenv("PCP_CACHE_DIR", str(path))
    return path


def warnings(events: list) -> list[str]:
    return [e["event"] for e in events if e["log_level"] == "warning"]


def test_created_private_with_a_digest_beside_each_module(cache: Path) -> None:
    first, second = compile_double(), compile_double()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert not first.cache_hit and second.cache_hit and first.vmfb == second.vmfb
    (module,) = cache.glob("*.vmfb")
    record = json.loads(module.with_suffix(".json").read_text())
    assert record["key"] == module.stem and record["vmfb_sha256"] == first.sha256
    assert sorted(p.suffix for p in cache.iterdir()) == [".json", ".vmfb"]  # no partial files


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702], ids=oct)
def test_a_directory_others_can_write_is_not_used(cache: Path, mode: int) -> None:
    cache.mkdir(parents=True)
    cache.chmod(mode)
    events: list = []
    first, second = compile_double(events), compile_double(events)
    assert not first.cache_hit and not second.cache_hit
    assert list(cache.iterdir()) == []  # nothing read from or written to it
    (warning, _) = warnings(events)
    assert "compile cache not used" in warning
    reasons = [e["reason"] for e in events if e["log_level"] == "warning"]
    assert "group or others can write" in reasons[0]


def test_a_directory_of_another_user_is_not_used(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compile_double()  # a good entry, in a directory that belongs to someone else below
    monkeypatch.setattr(os, "getuid", lambda: cache.stat().st_uid + 1)
    events: list = []
    assert not compile_double(events).cache_hit
    assert any("not by this user" in e.get("reason", "") for e in events)


def test_a_link_to_a_private_directory_is_followed_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, link = tmp_path / "real", tmp_path / "link"
    target.mkdir(mode=0o700)
    link.symlink_to(target)
    monkeypatch.setenv("PCP_CACHE_DIR", str(link))
    assert not compile_double().cache_hit and compile_double().cache_hit
    target.chmod(0o777)
    assert not compile_double().cache_hit


def test_a_foreign_entry_is_recompiled(cache: Path) -> None:
    """A module someone put there under the computable key, without a digest."""
    good = compile_double()
    (module,) = cache.glob("*.vmfb")
    module.with_suffix(".json").unlink()
    module.write_bytes(b"planted module")
    events: list = []
    again = compile_double(events)
    assert not again.cache_hit and again.vmfb == good.vmfb
    assert any("no digest" in w for w in warnings(events))
    assert compile_double().cache_hit  # rewritten, with its digest


@pytest.mark.parametrize("change", ["module", "digest"])
def test_a_tampered_entry_is_recompiled(cache: Path, change: str) -> None:
    good = compile_double()
    (module,) = cache.glob("*.vmfb")
    if change == "module":
        flipped = bytearray(good.vmfb)
        flipped[len(flipped) // 2] ^= 0xFF
        module.write_bytes(bytes(flipped))
    else:
        digest = module.with_suffix(".json")
        digest.write_text(json.dumps({**json.loads(digest.read_text()), "key": "0" * 64}))
    events: list = []
    again = compile_double(events)
    assert not again.cache_hit and again.vmfb == good.vmfb
    assert any("does not match its digest" in w for w in warnings(events))
    assert compile_double().cache_hit


def test_pytest_temporary_directories_pass_the_checks(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The session caches of pcp_core's pytest plugin and of conftest files are these."""
    assert unsafe_cache_dir_reason(tmp_path_factory.mktemp("pcp-vmfb-cache").resolve()) is None
    assert unsafe_cache_dir_reason(Path(os.environ["PCP_CACHE_DIR"]).resolve()) is None


def test_a_flag_naming_a_file_is_keyed_by_its_contents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same tuning spec installed in two places shares cache entries; an edited one
    does not; a value that is no absolute path stays itself, file or not."""
    here, there = tmp_path / "here.mlir", tmp_path / "there.mlir"
    here.write_text("spec")
    there.write_text("spec")
    flag = "--iree-codegen-tuning-spec-path="
    assert flags_for_key([flag + str(here)]) == flags_for_key([flag + str(there)])
    there.write_text("edited spec")
    assert flags_for_key([flag + str(here)]) != flags_for_key([flag + str(there)])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sm_80").write_text("spec")
    assert flags_for_key(["--iree-cuda-target=sm_80", "-O2"]) == ["--iree-cuda-target=sm_80", "-O2"]
