"""The compile cache is private and checked: an entry is used only if this user's
directory holds it, no one else can write there, and it matches its digest. It is kept
under a size limit, least recently used entries first, and `pcp cache` shows and empties it."""

import json
import os
import re
import stat
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from pcp_core import compile_cache
from pcp_core.compile_cache import unsafe_cache_dir_reason
from pcp_core.iree.compiler import compile_program, flags_for_key
from tests.conftest import run_pcp

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
    path = tmp_path / "made-by-pcp" / "compiled"
    monkeypatch.setenv("PCP_CACHE_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def fresh_limit() -> None:
    """PCP_CACHE_MAX_GB is read once a value: each test reads it anew."""
    compile_cache._limit.cache_clear()


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
    assert unsafe_cache_dir_reason(tmp_path_factory.mktemp("pcp-compile-cache").resolve()) is None
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


def entry_files(directory: Path, key: str, used: float, size: int) -> list[Path]:
    """An IREE entry as PCP writes one, `size` bytes, last used at `used` (epoch s)."""
    module, digest = directory / f"{key}.vmfb", directory / f"{key}.json"
    module.write_bytes(b"m" * size)
    digest.write_text("{}")
    for path in (module, digest):
        os.utime(path, (used, used))
    return sorted([module, digest])


def test_trimming_removes_the_least_recently_used_entries_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the size limit the oldest entries go, whole. Files not named as PCP and jax
    name theirs stay (where PCP_CACHE_DIR is a folder in use), and so does a file another
    process is still writing."""
    monkeypatch.setenv("PCP_CACHE_MAX_GB", str(2500 / 1e9))  # room for two 1000-byte entries
    now = time.time()
    oldest = entry_files(tmp_path, "a" * 64, now - 300, 1000)
    older = entry_files(tmp_path, "b" * 64, now - 200, 1000)
    newer = entry_files(tmp_path, "c" * 64, now - 100, 1000)
    xla = tmp_path / "xla"
    (xla / ".git").mkdir(parents=True)
    # jax's names keep dots: two steps, the first with its access time
    steps = [xla / f"jit_step.{name}" for name in ("a-0123-cache", "a-0123-atime", "b-4-cache")]
    theirs = [
        tmp_path / "notes.txt",
        tmp_path / ("d" * 64),  # a bare sha256: a dataset shard, say
        tmp_path / f"{'d' * 64}.npy",
        xla / "notes.txt",
        xla / ".git" / "HEAD",
        xla / ".lockfile",
    ]
    autotuning = xla / compile_cache.XLA_AUTOTUNING
    device = autotuning / "ed0e56ab8b2a0ecb"  # a kind of device (jax 0.11)
    (device / "tmp").mkdir(parents=True)
    (autotuning / "tmp").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (autotuning / "linked").symlink_to(elsewhere)
    tuned = [autotuning / "hSAm-_1x.textproto", device / "9e95a6e626b0520b3d04a22c423c09ae.pb"]
    theirs += [elsewhere / "9e95a6e626b0520b3d04a22c423c09ae.pb", device / "notes.txt"]
    writing = [
        tmp_path / f"{'e' * 64}.vmfb.x1y2_abc.partial",
        autotuning / "tmp" / "tmp_1.pb",
        device / "tmp" / "tmp_2.pb",
    ]
    for path in (*steps, *tuned, *theirs, *writing):
        path.write_bytes(b"y" * 5000 if path in (*theirs, *writing) else b"x" * 10)
    removed = compile_cache.trim(tmp_path)
    assert [entry.files for entry in removed] == [oldest]
    assert not any(path.exists() for path in oldest)
    assert all(path.exists() for path in [*older, *newer, *steps, *tuned, *theirs, *writing])
    found = compile_cache.entries(tmp_path)
    kinds = {"IREE modules", "XLA executables", "XLA autotuning results"}
    assert {entry.kind for entry in found} == kinds
    assert sorted(e.files for e in found if e.kind == "XLA autotuning results") == sorted(
        [path] for path in tuned
    )
    assert sorted(e.files for e in found if e.kind == "XLA executables") == [
        sorted(steps[:2]),
        steps[2:],
    ]


def test_a_crash_leftover_goes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A half-written file left long ago counts, and goes before a newer entry."""
    newer = entry_files(tmp_path, "a" * 64, time.time() - 60, 1000)
    leftover = tmp_path / f"{'e' * 64}.mlir.json.k3j4.partial"
    leftover.write_bytes(b"z" * 1000)
    long_ago = time.time() - 2 * compile_cache.PARTIAL_LEFTOVER_S
    os.utime(leftover, (long_ago, long_ago))
    monkeypatch.setenv("PCP_CACHE_MAX_GB", str(1500 / 1e9))
    (removed,) = compile_cache.trim(tmp_path)
    assert removed.kind == compile_cache.INCOMPLETE and not leftover.exists()
    assert all(path.exists() for path in newer)


def test_a_cache_hit_keeps_its_entry_over_older_unused_ones(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trimming goes by last use, not by age: PCP marks a module it read from the cache
    (on any file system: its access time is not what counts)."""
    compile_double()
    (module,) = cache.glob("*.vmfb")
    long_ago = time.time() - 3600
    for path in (module, module.with_suffix(".json")):
        os.utime(path, (long_ago, long_ago))
    unused = entry_files(cache, "f" * 64, time.time() - 60, module.stat().st_size)
    assert compile_double().cache_hit
    for path in (module, module.with_suffix(".json")):  # the read's access time aside
        os.utime(path, (long_ago, path.stat().st_mtime))
    monkeypatch.setenv("PCP_CACHE_MAX_GB", str(1.5 * module.stat().st_size / 1e9))
    (removed,) = compile_cache.trim(cache)
    assert removed.files == unused and module.exists()


def test_a_limit_that_is_no_number_keeps_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad PCP_CACHE_MAX_GB does not stop a run: it is warned about, and 10 GB holds."""
    for text in ("ten", "-1", "nan", "inf"):
        monkeypatch.setenv("PCP_CACHE_MAX_GB", text)
        with capture_logs() as events:
            assert compile_cache.max_bytes() == int(compile_cache.DEFAULT_MAX_GB * 1e9)
            compile_cache.max_bytes()  # read after every write: warned about once
        (warning,) = warnings(events)
        assert "PCP_CACHE_MAX_GB is not a number" in warning


def test_pcp_cache_shows_and_clears_what_a_compile_left(cache: Path) -> None:
    """As a user sees it: where the cache is, what it holds by kind, and empty after clear."""
    compile_double()
    shown = run_pcp("cache", "show")
    assert shown.returncode == 0, shown.stderr
    assert f"compile cache: {cache}" in shown.stdout
    assert re.search(r"IREE modules\s+1\s", shown.stdout), shown.stdout
    cleared = run_pcp("cache", "clear")
    assert cleared.returncode == 0, cleared.stderr
    assert "removed 1 entry" in cleared.stdout
    assert not list(cache.iterdir())
    assert "empty" in run_pcp("cache", "show").stdout
    assert not compile_double().cache_hit


def test_pcp_cache_will_not_clear_a_folder_others_can_write(cache: Path) -> None:
    """Such a folder is not used, so what is in it is not PCP's to delete."""
    compile_double()
    cache.chmod(0o777)
    assert "not used: mode drwxrwxrwx" in run_pcp("cache", "show").stdout
    cleared = run_pcp("cache", "clear")
    assert cleared.returncode == 2 and "not clearing" in cleared.stderr
    assert list(cache.glob("*.vmfb"))


def test_a_linked_xla_folder_is_not_the_caches(tmp_path: Path) -> None:
    """`xla/` as a link leads out of the cache: nothing there is counted or removed."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / compile_cache.XLA_AUTOTUNING).mkdir(parents=True)
    files = [elsewhere / "jit_step-0-cache", elsewhere / compile_cache.XLA_AUTOTUNING / "a.pb"]
    for path in files:
        path.write_bytes(b"x")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "xla").symlink_to(elsewhere)
    assert compile_cache.entries(cache) == []


def test_an_entry_that_cannot_be_removed_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file trimming may not delete (another user's, a read-only disk) does not stop it:
    the next entry goes instead, with a warning."""
    now = time.time()
    stuck = entry_files(tmp_path, "a" * 64, now - 300, 1000)
    older = entry_files(tmp_path, "b" * 64, now - 200, 1000)
    newer = entry_files(tmp_path, "c" * 64, now - 100, 1000)
    unlink = Path.unlink

    def refusing(path: Path, missing_ok: bool = False) -> None:
        if path in stuck:
            raise PermissionError(13, "Permission denied")
        unlink(path, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refusing)
    monkeypatch.setenv("PCP_CACHE_MAX_GB", str(2500 / 1e9))
    with capture_logs() as events:
        removed = compile_cache.trim(tmp_path)
    assert [entry.files for entry in removed] == [older]
    assert all(path.exists() for path in [*stuck, *newer])
    assert "could not remove some" in warnings(events)[0]


def test_an_entry_trimmed_while_it_is_read_is_a_quiet_miss(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's trim between reading a module and its digest: compiled again,
    with no warning of a foreign entry."""
    compile_double()
    (module,) = cache.glob("*.vmfb")
    read_bytes = Path.read_bytes

    def read_then_trimmed(path: Path) -> bytes:
        data = read_bytes(path)
        if path == module:
            (entry,) = compile_cache.entries(cache)
            assert compile_cache.remove(entry) is None
        return data

    monkeypatch.setattr(Path, "read_bytes", read_then_trimmed)
    events: list = []
    assert not compile_double(events).cache_hit
    assert not warnings(events)
