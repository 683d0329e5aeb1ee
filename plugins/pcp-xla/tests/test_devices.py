"""One worker on several devices (`--devices`): data-parallel inner steps that give what
one device gives at the same batch, and a DiLoCo run of such workers. On the CPU, XLA
makes several host devices (`--xla_force_host_platform_device_count`), in a process of
their own: jax fixes its device count when it starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16"]

# The reference program's first call on one device and on a mesh of two, from the same
# parameters and batch; prints how far apart they end, and what the mesh compiled to.
SHARDED_AGAINST_ONE = r"""
import json, re
import numpy as np
from pcp_xla import BACKEND
from pcp_xla.runtime import XLA
from pcp_core.testing.reference import BATCH, STEPS_PER_CALL, initial_params, reference

corpus, config, program = reference()
params = initial_params(config)
batch = corpus.batches("train", STEPS_PER_CALL, BATCH, config["block_size"], (0, 0))
ends, rows = [], []
for devices in (None, (0, 1)):
    artifact = XLA.build(program, BACKEND, "cpu", 1 if devices is None else len(devices))
    executor = XLA.open(artifact.data, BACKEND, program, devices)
    executor.set_params(params)
    executor.set_opt_state(program.init_opt_state(params))
    losses = executor.run(*batch)
    state = executor.device_state()
    ends.append((losses, executor.params(), executor.opt_state()))
    # the most rows a matrix product of the compiled step takes: batch x block on one device
    products = re.findall(r"= f32\[(\d+),\d+\]\S* dot\(", executor._step.as_text())
    rows.append(max(int(r) for r in products))
placed = {len(a.devices()) for a in state}
kept, moments = state[: len(program.param_specs)], state[len(program.param_specs) :]
hlo = executor._step.as_text()
one, two = ends
print(json.dumps({
    "losses": float(np.max(np.abs(one[0] - two[0]))),
    "params": max(float(np.max(np.abs(a - b))) for a, b in zip(one[1], two[1])),
    "opt_state": max(float(np.max(np.abs(a - b))) for a, b in zip(one[2], two[2])),
    "moved": max(float(np.max(np.abs(a - b))) for a, b in zip(params, one[1])),
    "state_on_devices": sorted(placed),
    "params_whole": all(a.addressable_shards[0].data.shape == a.shape for a in kept),
    "moments_split": sum(a.addressable_shards[0].data.size * 2 == a.size for a in moments),
    "moments": sum(a.ndim > 0 for a in moments),
    "all_reduce": "all-reduce" in hlo,
    "product_rows": rows,
}))
"""


def host_devices(count: int) -> dict[str, str]:
    """This process's environment, with jax on its CPU platform (on a GPU machine too),
    split into `count` devices."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}"
    return {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}


def test_sharded_inner_steps_equal_one_device_at_the_same_batch() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SHARDED_AGAINST_ONE],
        capture_output=True,
        text=True,
        env=host_devices(2),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["moved"] > 1e-3  # the call trained: equality below is not of no change
    assert found["losses"] < 1e-5 and found["params"] < 1e-5 and found["opt_state"] < 1e-5
    # the state is on both devices, the gradients summed across them; the parameters
    # whole on each, the optimizer's moments split between them (not its step counters)
    assert found["state_on_devices"] == [2] and found["all_reduce"]
    assert found["params_whole"] and found["moments_split"] == found["moments"]
    # every matrix product works on a device's half of the batch, not the whole
    one, two = found["product_rows"]
    assert two * 2 == one, found["product_rows"]


# Where the exporting process has the devices a step is exported for (the shepherd of a
# machine's local workers), it exports for a mesh of its own: then a call that jax lowers
# only with devices present can run on each device's part of the batch (cuDNN's
# attention); where it has not (a shepherd without GPUs), for an abstract mesh.
EXPORT_MESH = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from pcp_core.program.platform_export import exporting_for
from pcp_core.program.mesh import data_parallel, devices_at_hand, export_mesh, on_each_device
with exporting_for("cpu", 2):
    found = {"mesh": type(export_mesh()).__name__, "at_hand": devices_at_hand()}
    if found["at_hand"]:
        centred = on_each_device(lambda a: a - a.mean(axis=0, keepdims=True))
        rows = jnp.arange(8.0).reshape(4, 2)
        step = jax.jit(lambda x: centred(data_parallel(x, True)))
        found["centred"] = np.asarray(step(rows)).tolist()
with exporting_for("cpu"):
    found["one"] = [export_mesh() is None, devices_at_hand()]
print(json.dumps(found))
"""


def test_a_step_for_several_devices_is_exported_for_the_devices_at_hand() -> None:
    found = {}
    for count in (1, 2):
        result = subprocess.run(
            [sys.executable, "-c", EXPORT_MESH],
            capture_output=True,
            text=True,
            env=host_devices(count),
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        found[count] = json.loads(result.stdout.splitlines()[-1])
    assert found[1] == {"mesh": "AbstractMesh", "at_hand": False, "one": [True, True]}
    assert found[2]["mesh"] == "Mesh" and found[2]["at_hand"]
    # each device centres its own two rows: the mean of each half, not of all four
    assert found[2]["centred"] == [[-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]]


def train(out: Path, devices_per_worker: int) -> tuple[list[dict], str]:
    """A two-worker DiLoCo run of xla workers; its per-round metrics and its log."""
    command = [sys.executable, "-m", "pcp_core", "train", "--algorithm", "diloco"]
    command += ["--backend", "xla", "--worker-backends", "xla,xla"]
    command += ["--devices-per-worker", str(devices_per_worker), "--steps", "20"]
    command += ["--inner-steps", "10", "--eval-every", "10", "--batch-size", "4"]
    command += ["--out", str(out), *TINY]
    result = subprocess.run(
        command, capture_output=True, text=True, env=host_devices(4), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in records], result.stderr


@pytest.mark.slow
def test_two_workers_of_two_devices_each_send_what_single_device_workers_send(
    tmp_path: Path,
) -> None:
    (sharded, log), (single, _) = train(tmp_path / "2x2", 2), train(tmp_path / "2x1", 1)
    joined = [line for line in log.splitlines() if "worker joined" in line]
    assert sorted(line.split("on devices ")[1][:3] for line in joined) == ["0,1", "2,3"]
    assert [r["workers"] for r in sharded] == [2, 2]  # one result per worker per round
    # one pseudo-gradient of the whole model a worker, not one a device (twice the bytes);
    # fp4 Huffman-codes its values, so sums in another order may move its size by a few bytes
    for mine, theirs in zip(sharded, single, strict=True):
        assert mine["pseudo_gradient_bytes"] == pytest.approx(
            theirs["pseudo_gradient_bytes"], rel=0.01
        )
    # the same run, split over two devices a worker: the same model to float tolerance
    assert abs(sharded[-1]["val_loss"] - single[-1]["val_loss"]) < 1e-3


def test_a_worker_names_devices_this_machine_has(tmp_path: Path) -> None:
    for devices, says in [
        ("0,3", "--devices 0,3: no device 3 (this machine has 2: 0 to 1)"),
        ("0,0", "--devices 0,0: a device is named twice"),
        ("first", "--devices must be 'all' or device indices such as 0,1; got 'first'"),
    ]:
        command = [sys.executable, "-m", "pcp_core", "worker", "--connect", "127.0.0.1:9"]
        command += ["--backend", "xla", "--restarts", "0", "--devices", devices]
        result = subprocess.run(
            command, capture_output=True, text=True, env=host_devices(2), timeout=120
        )
        assert result.returncode == 2 and result.stderr == f"error: {says}\n", result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--devices-per-worker", "4"], "2 xla worker(s) with --devices-per-worker 4 need 8"),
        (["--devices-per-worker", "2", "--batch-size", "3"], "--batch-size 3 does not split"),
        (["--devices-per-worker", "2", "--device", "1"], "--device names one device"),
    ],
)
def test_a_local_run_has_the_devices_its_workers_need(
    args: list[str], says: str, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "pcp_core", "train", "--algorithm", "diloco"]
    command += ["--worker-backends", "xla,xla", *args, "--out", str(tmp_path / "run")]
    result = subprocess.run(command, capture_output=True, text=True, env=host_devices(2))
    assert result.returncode == 2 and result.stderr.startswith(f"error: {says}"), result.stderr
    assert not (tmp_path / "run").exists()


def test_the_shepherd_refuses_several_devices_on_a_backend_of_one() -> None:
    from pcp_xla import BACKEND

    from pcp_core.plugins import host
    from pcp_core.shepherd.admission import Admission

    assert Admission._check_devices(BACKEND, "0,1,2") == 3
    assert Admission._check_devices(BACKEND, "") == 1  # a worker from before --devices
    with pytest.raises(ValueError, match="a cpu worker drives one device"):
        Admission._check_devices(host().backend("cpu"), "0,1")
    for label in ("0,0", "0,x", "99999"):
        with pytest.raises(ValueError, match="not distinct device indices"):
            Admission._check_devices(BACKEND, label)
