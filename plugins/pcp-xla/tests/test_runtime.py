"""The join check and the state check of the XLA runtime, each shown refusing."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pcp_xla import BACKEND
from pcp_xla.runtime import XLA, XlaExecutor, _exported_versions

from pcp_core.program import checkpoint
from pcp_core.testing.reference import BATCH, STEPS_PER_CALL, initial_params, reference

PLATFORM = BACKEND.resolve_arch()  # this machine's: cpu here, cuda on an NVIDIA GPU
OTHER = "tpu" if PLATFORM != "tpu" else "cpu"


def report(**changes: Any) -> dict[str, Any]:
    return {**XLA.worker_report(BACKEND), **changes}


def test_a_worker_like_the_shepherd_is_served() -> None:
    assert XLA.refusal(BACKEND, PLATFORM, report()) is None


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        ({"platform": OTHER}, f"runs on {OTHER!r}, not on {PLATFORM!r}"),
        ({"calling_conventions": [1, 2]}, "exports calling convention"),
        ({"calling_conventions": None}, "did not say which calling conventions"),
        ({"stablehlo": "0.9.0"}, "reads up to 0.9.0"),
    ],
)
def test_a_worker_whose_jax_cannot_run_the_artifact_is_refused(
    changes: dict[str, Any], refusal: str
) -> None:
    assert refusal in (XLA.refusal(BACKEND, PLATFORM, report(**changes)) or "")


def test_the_artifact_is_the_exported_step_for_the_platform() -> None:
    import jax

    _, _, program = reference()
    artifact = XLA.build(program, BACKEND, "cuda")  # no GPU needed to build for one
    exported = jax.export.deserialize(bytearray(artifact.data))
    assert exported.platforms == ("cuda",) and artifact.kind == "xla-export"
    assert exported.calling_convention_version == _exported_versions()[0]


class CopyingExecutor(XlaExecutor):
    """Copies the state through the host before every call: what the check must catch."""

    def run(self, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        self.set_params(self.params())
        self.set_opt_state(self.opt_state())
        return super().run(inputs, targets)


@pytest.mark.parametrize("executor_class", [XlaExecutor, CopyingExecutor])
def test_the_state_check_catches_a_copying_executor(executor_class: type) -> None:
    corpus, config, program = reference()
    artifact = XLA.build(program, BACKEND, PLATFORM)
    executor = executor_class(artifact.data, program.param_specs, program.opt_specs)
    params = initial_params(config)
    executor.set_params(params)
    executor.set_opt_state(program.init_opt_state(params))
    block = config["block_size"]
    batches = [corpus.batches("train", STEPS_PER_CALL, BATCH, block, (0, i)) for i in range(2)]
    if executor_class is XlaExecutor:
        XLA.assert_state_stays_on_device(executor, batches)
    else:
        with pytest.raises(AssertionError, match="copied, not donated"):
            XLA.assert_state_stays_on_device(executor, batches)


def test_an_unknown_platform_or_another_machines_artifact_is_one_line() -> None:
    from pcp_core.backends import CompileError, DeviceError

    _, _, program = reference()
    with pytest.raises(CompileError, match="not 'bogus'"):
        XLA.build(program, BACKEND, "bogus")
    artifact = XLA.build(program, BACKEND, OTHER)
    with pytest.raises(DeviceError, match=f"built for {OTHER}, but this jaxlib runs on"):
        XlaExecutor(artifact.data, program.param_specs, program.opt_specs)


def test_a_cuda_worker_must_run_the_shepherds_jax() -> None:
    """The CUDA step may call cuDNN's attention, which jax keeps for one version only."""
    theirs = report(platform="cuda", jax="0.0.1")
    assert "install jax==" in (XLA.refusal(BACKEND, "cuda", theirs) or "")
    assert XLA.refusal(BACKEND, "cuda", report(platform="cuda")) is None


def test_compiler_options_for_the_platform_reach_the_compile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pcp_xla import executor as xla_executor

    _, _, program = reference()
    artifact = XLA.build(program, BACKEND, PLATFORM)
    monkeypatch.setattr(xla_executor, "COMPILER_OPTIONS", {PLATFORM: {"no_such_xla_option": True}})
    with pytest.raises(Exception, match="no_such_xla_option"):
        XlaExecutor(artifact.data, program.param_specs, program.opt_specs)
    monkeypatch.setattr(
        xla_executor, "COMPILER_OPTIONS", {PLATFORM: {"xla_allow_excess_precision": False}}
    )
    XlaExecutor(artifact.data, program.param_specs, program.opt_specs)


def test_a_second_executor_loads_the_compiled_step_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that joins again compiles nothing: the step comes from jax's persistent
    compilation cache in PCP's compile cache, and computes what the compiled one did; past
    the cache's size limit, the entry goes once loaded."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache
    from pcp_xla import executor as xla_executor

    corpus, config, program = reference()
    artifact = XLA.build(program, BACKEND, PLATFORM)
    batch = corpus.batches("train", STEPS_PER_CALL, BATCH, config["block_size"], (0, 0))
    monkeypatch.setenv("PCP_CACHE_DIR", str(tmp_path))

    def losses_of_a_new_executor() -> list[float]:
        executor = XlaExecutor(artifact.data, program.param_specs, program.opt_specs)
        params = initial_params(config)
        executor.set_params(params)
        executor.set_opt_state(program.init_opt_state(params))
        return list(executor.run(*batch))

    hits: list[str] = []

    def on_event(event: str, **_: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            hits.append(event)

    saved = (
        jax.config.jax_compilation_cache_dir,
        jax.config.jax_persistent_cache_min_compile_time_secs,
    )
    jax.config.update("jax_compilation_cache_dir", None)  # as in a fresh worker process
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # (a CPU compile is quick)
    compilation_cache.reset_cache()
    xla_executor.keep_compiled_steps.cache_clear()
    jax.monitoring.register_event_listener(on_event)
    try:
        compiled = losses_of_a_new_executor()
        assert not hits and any((tmp_path / "xla").glob("jit_call-*"))
        assert losses_of_a_new_executor() == compiled
        assert len(hits) == 1
        monkeypatch.setenv("PCP_CACHE_MAX_GB", "0")  # the cache is kept under its limit
        assert losses_of_a_new_executor() == compiled
        assert not any((tmp_path / "xla").glob("jit_call-*"))
    finally:
        jax.monitoring.unregister_event_listener(on_event)
        jax.config.update("jax_compilation_cache_dir", saved[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", saved[1])
        compilation_cache.reset_cache()
        xla_executor.keep_compiled_steps.cache_clear()


def test_a_linked_xla_folder_keeps_no_compiled_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`xla/` in the compile cache as a link leads to a folder no one checked: jax is not
    pointed there, and the worker compiles each time, saying why."""
    import jax
    from pcp_xla import executor as xla_executor
    from structlog.testing import capture_logs

    cache, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    cache.mkdir(mode=0o700)
    elsewhere.mkdir()
    (cache / "xla").symlink_to(elsewhere)
    monkeypatch.setenv("PCP_CACHE_DIR", str(cache))
    saved = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    xla_executor.keep_compiled_steps.cache_clear()
    try:
        with capture_logs() as events:
            assert xla_executor.keep_compiled_steps() is None
        assert jax.config.jax_compilation_cache_dir is None
        assert any(e["event"].startswith("compiled steps not kept") for e in events)
    finally:
        jax.config.update("jax_compilation_cache_dir", saved)
        xla_executor.keep_compiled_steps.cache_clear()


def test_a_params_snapshot_outlives_the_next_call_and_feeds_another_executor() -> None:
    corpus, config, program = reference()
    artifact = XLA.build(program, BACKEND, PLATFORM)
    executor = XlaExecutor(artifact.data, program.param_specs, program.opt_specs)
    params = initial_params(config)
    executor.set_params(params)
    executor.set_opt_state(program.init_opt_state(params))
    block = config["block_size"]
    executor.run(*corpus.batches("train", STEPS_PER_CALL, BATCH, block, (0, 0)))
    snapshot = executor.params_snapshot()
    assert all(a.sharding.memory_kind == "pinned_host" for a in snapshot)  # on cpu and cuda
    expected = executor.params()
    executor.run(*corpus.batches("train", STEPS_PER_CALL, BATCH, block, (0, 1)))  # donates
    for kept, host in zip(snapshot, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(kept), host)

    other = XlaExecutor(artifact.data, program.param_specs, program.opt_specs)
    other.set_params(snapshot)  # on the device, copied there: its calls donate the copy
    assert all(not a.is_deleted() for a in snapshot)
    other.set_opt_state(program.init_opt_state(expected))
    other.run(*corpus.batches("train", STEPS_PER_CALL, BATCH, block, (0, 2)))
    assert all(not a.is_deleted() for a in snapshot)
    with pytest.raises(ValueError, match="expected"):
        other.set_params(snapshot[:-1])


def test_pcp_train_evaluates_and_checkpoints_from_snapshots(tmp_path: Path) -> None:
    """The local loop on this backend: one evaluation before the first step (its copies
    set up there), then the snapshots at each evaluation feed the eval and the checkpoint."""
    out = tmp_path / "run"
    tiny = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32"]
    command = [sys.executable, "-m", "pcp_core", "train", "--backend", "xla", "--steps", "60"]
    command += ["--eval-every", "30", "--out", str(out), *tiny]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "evaluated before training" in result.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss" in r] == [30, 60]
    params, metadata = checkpoint.load(out / "checkpoint.safetensors")
    assert metadata["step"] == "60" and params["wte"].shape[1] == 32
    assert json.loads((out / "summary.json").read_text())["checkpoint_error"] is None
