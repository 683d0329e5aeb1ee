"""The TensorBoard sink: records in, event files out, read back with TensorBoard's own
reader (`EventAccumulator`), never a mock of either side.

The slow tests train for real (`pcp train`, locally and with DiLoCo on two workers) and
check the event files hold what metrics.jsonl holds, to float32 (TensorBoard's scalars).
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pcp_tensorboard import FOLDER, TENSORBOARD
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.plugin_event_accumulator import (
    EventAccumulator as PluginEventAccumulator,
)
from tensorboard.util.tensor_util import make_ndarray

from pcp_core.testing.algorithm_suite import TINY_MODEL, run_pcp
from pcp_core.watch.scalars import scalars

SHORT = ("--batch-size", "4", "--steps", "20", "--steps-per-call", "10")


def read(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard shows for `folder`: tag -> [(step, value)]."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def read_as_the_server_does(folder: Path, tag: str) -> list[tuple[int, float]]:
    """One scalar as `tensorboard --load_fast=false` reads it (its purging differs)."""
    events = PluginEventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    return [(e.step, make_ndarray(e.tensor_proto).item()) for e in events.Tensors(tag)]


def f32(value: float) -> float:
    """`value` as TensorBoard keeps it: a float32."""
    return float(np.float32(value))


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def series(records: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(r["step"], f32(r[key])) for r in records if r.get(key) is not None]


ROUND = {  # a DiLoCo round's record, as pcp_diloco writes it
    "round": 2,
    "step": 30,
    "loss": 2.5,
    "worker_losses": {"0": 2.25, "1": 2.75},
    "workers": 2,
    "attempts": 1,
    "rejected": {"2": "norm 40x the median"},
    "tokens": 3840,
    "elapsed_s": 3.5,
    "bytes_sent": 860_000,
    "bytes_received": 860_100,
    "round_s": 1.25,
    "compute_s": 1.0,
    "communication_s": 0.25,
    "val_loss": 2.625,
}


def test_a_record_becomes_tagged_scalars() -> None:
    assert scalars(ROUND) == {
        "loss/train": 2.5,
        "loss/worker/0": 2.25,
        "loss/worker/1": 2.75,
        "loss/val": 2.625,
        "workers/count": 2,
        "workers/attempts": 1,
        "workers/rejected": 1,
        "throughput/tokens": 3840,
        "time/elapsed_s": 3.5,
        "network/bytes_sent": 860_000,
        "network/bytes_received": 860_100,
        "time/round_s": 1.25,
        "time/compute_s": 1.0,
        "time/communication_s": 0.25,
    }
    # another algorithm's numbers are kept too; text and the x axis are not plotted
    other = {"step": 5, "loss": 1.0, "lr": 0.5, "grad": {"norm": 2.0, "what": "x"}, "note": "hi"}
    assert scalars(other) == {"loss/train": 1.0, "other/lr": 0.5, "other/grad/norm": 2.0}


def test_the_writer_on_hand_made_records(tmp_path: Path) -> None:
    writer = TENSORBOARD.open(tmp_path, {"algorithm": "diloco", "lr": 0.001}, False)
    first = {**ROUND, "round": 0, "step": 10, "tokens": 1280, "elapsed_s": 2.0}
    del first["val_loss"]
    second = {**ROUND, "round": 1, "step": 20, "tokens": 2560, "elapsed_s": 2.5, "loss": 2.4375}
    writer.write(first)
    writer.write(second)
    # each record is in the file once written, before close: a crash loses little
    shown = read(tmp_path / FOLDER)
    assert shown["loss/train"] == [(10, 2.5), (20, 2.4375)]
    assert shown["loss/worker/1"] == [(10, 2.75), (20, 2.75)]
    assert shown["loss/val"] == [(20, 2.625)]
    assert shown["network/bytes_sent"] == [(10, 860_000), (20, 860_000)]
    # tokens/s over the time between two records; none for the first (it holds set-up)
    assert shown["throughput/tokens_per_s"] == [(20, (2560 - 1280) / 0.5)]
    writer.close()
    events = EventAccumulator(str(tmp_path / FOLDER))
    events.Reload()
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"algorithm": "diloco"' in text  # the run's settings, beside its curves


def test_a_run_replacing_another_removes_it_and_a_resumed_one_continues_it(
    tmp_path: Path,
) -> None:
    def run(steps: range, loss: float, resume: bool = False) -> None:
        writer = TENSORBOARD.open(tmp_path, {}, resume)
        if resume:  # what a resuming algorithm does before it writes
            writer.keep_only(lambda record: record["step"] < steps.start)
        for step in steps:
            writer.write({"step": step, "loss": loss})
        writer.close()

    def files() -> int:
        return len(list((tmp_path / FOLDER).iterdir()))

    run(range(10, 50, 10), 3.0)  # steps 10..40
    run(range(20, 40, 10), 2.0)  # --overwrite: a new run into the same folder
    assert read(tmp_path / FOLDER)["loss/train"] == [(20, 2.0), (30, 2.0)] and files() == 1
    run(range(30, 60, 10), 1.0, resume=True)  # --resume from a checkpoint at step 20
    assert read(tmp_path / FOLDER)["loss/train"] == [(20, 2.0), (30, 1.0), (40, 1.0), (50, 1.0)]
    run(range(40, 70, 10), 0.5, resume=True)
    expected = [(20, 2.0), (30, 1.0), (40, 0.5), (50, 0.5), (60, 0.5)]
    assert read(tmp_path / FOLDER)["loss/train"] == expected and files() == 3
    assert read_as_the_server_does(tmp_path / FOLDER, "loss/train") == expected


def test_registered_and_cheap_to_import(pcp_host: Any) -> None:
    assert "tensorboard" in [sink.name for sink in pcp_host.metric_sinks()]
    code = "import sys, pcp_tensorboard; print('tensorboardX' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert imported.stdout.strip() == "False", imported.stderr


OPENED = """
import importlib.util, sys, tempfile
from pathlib import Path
from pcp_tensorboard import TENSORBOARD
installed = importlib.util.find_spec("torch") is not None
writer = TENSORBOARD.open(Path(tempfile.mkdtemp()), {}, False)
writer.write({"step": 1, "loss": 1.0})
writer.close()
print("torch" in sys.modules, "boto3" in sys.modules)
if installed:
    import torch  # hidden from tensorboardX only
"""


def test_a_run_does_not_import_torch_for_it(tmp_path: Path) -> None:
    """tensorboardX imports torch (3 s, 200 MB) where it is installed: not in a run."""
    opened = subprocess.run([sys.executable, "-c", OPENED], capture_output=True, text=True)
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.split() == ["False", "False"]


@pytest.mark.slow
def test_a_local_run_shows_its_metrics(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ("train", "--backend", "cpu", *TINY_MODEL, "--out", str(out))
    result = run_pcp(*args, *SHORT, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records, shown = metrics(out), read(out / FOLDER)
    assert [r["step"] for r in records] == [10, 20]
    assert shown["loss/train"] == series(records, "loss")
    assert shown["loss/train_mean"] == series(records, "loss_mean")
    assert shown["loss/val"] == series(records, "val_loss") and shown["loss/val"]
    assert shown["throughput/tokens"] == series(records, "tokens")
    assert [step for step, _ in shown["throughput/tokens_per_s"]] == [20]

    # --overwrite replaces the run: TensorBoard shows the new one alone
    shorter = ("--batch-size", "4", "--steps", "10", "--steps-per-call", "5")
    result = run_pcp(*args, *shorter, "--overwrite", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records, shown = metrics(out), read(out / FOLDER)
    assert [r["step"] for r in records] == [5, 10]
    assert shown["loss/train"] == series(records, "loss")
    assert shown["loss/val"] == series(records, "val_loss")
    assert len(list((out / FOLDER).iterdir())) == 1


@pytest.mark.slow
def test_a_resumed_diloco_run_shows_its_workers_and_traffic(tmp_path: Path) -> None:
    out = tmp_path / "run"
    distributed = ("--algorithm", "diloco", "--workers", "2", "--inner-steps", "10")
    args = ("train", "--backend", "cpu", *distributed, *TINY_MODEL, *SHORT, "--out", str(out))
    result = run_pcp(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # a third round, by a new process: TensorBoard shows one run, from both files
    result = run_pcp("train", "--resume", str(out), "--steps", "30", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records, shown = metrics(out), read(out / FOLDER)
    assert [r["step"] for r in records] == [10, 20, 30]
    assert len(list((out / FOLDER).iterdir())) == 2
    assert shown["loss/train"] == series(records, "loss")
    assert shown["loss/val"] == series(records, "val_loss") and shown["loss/val"]
    for worker in ("0", "1"):
        expected = [(r["step"], f32(r["worker_losses"][worker])) for r in records]
        assert shown[f"loss/worker/{worker}"] == expected
    for key, tag in [
        ("tokens", "throughput/tokens"),
        ("bytes_sent", "network/bytes_sent"),
        ("bytes_received", "network/bytes_received"),
        ("compute_s", "time/compute_s"),
        ("communication_s", "time/communication_s"),
        ("workers", "workers/count"),
    ]:
        assert shown[tag] == series(records, key), tag
    assert all(value > 0 for _, value in shown["network/bytes_sent"])
