"""DiLoCo's result against a reference computed here: the same program run by XLA
(`TrainProgram.jax_step`) on the batches each worker sees, then the outer step by hand.

The `pcp train` run goes first, in its own process; the reference is computed while it
runs. IREE and XLA differ in the last bits, hence relative tolerances of 1e-4.
"""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pcp_diloco.planning import plan
from safetensors.numpy import load_file

from pcp_core import config_file, plugins
from pcp_core.config_file import declared_settings
from pcp_core.program import training

MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 64, "block_size": 32, "batch_size": 8}
# without warmup the first steps already move the weights, so a wrong reference shows
COMMON = {"algorithm": "diloco", "backend": "cpu", "warmup_steps": 0, "inner_warmup_steps": 0}
COMMON |= {"seed": 3, **MODEL}
# the outer step by hand is float32's; what a lossy codec changes is test_codec_rounds's
COMMON |= {"codec": "f32", "codec_down": "f32"}


def cli_flags(settings: dict[str, Any]) -> list[str]:
    return [part for k, v in settings.items() for part in ("--" + k.replace("_", "-"), str(v))]


def reference_setup(settings: dict[str, Any]) -> Any:
    """The training setup the shepherd builds for these settings (DiLoCo's plan included)."""
    host = plugins.host()
    planned, _ = plan(config_file.resolve(None, settings, declared=declared_settings(host)), host)
    return training.prepare(planned, host)


def local_steps(
    setup: Any, params: list[np.ndarray], opt: list[np.ndarray], round_: int, worker: int
) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
    """What worker `worker` does in round `round_`, run by XLA from (params, opt)."""
    program, run = setup.program, setup.config
    shards = run.shepherd.workers
    losses: list[float] = []
    for call in range(run.settings("diloco").inner_steps // program.steps_per_call):
        x, y = setup.corpus.batches(
            "train",
            program.steps_per_call,
            program.batch_size,
            program.block_size,
            stream=(run.seed, round_, worker, call),
            shard=((worker + round_) % shards, shards),
        )
        new_params, new_opt, step_losses = program.jax_step(tuple(params), tuple(opt), x, y)
        params = [np.asarray(p) for p in new_params]
        opt = [np.asarray(o) for o in new_opt]
        losses += [float(v) for v in np.asarray(step_losses)]
    return params, opt, losses


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def assert_close(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """Relative error under 1e-4 per tensor, but for the attention's key bias.

    A key bias gets no gradient in exact arithmetic (softmax ignores whatever adds the same
    to every key), so its Adam updates are rounding noise scaled up, and IREE's noise is
    not XLA's: it is only checked to stay tiny next to the query and value biases.
    """
    errors = {}
    for name, want in expected.items():
        got = actual[name]
        if name.endswith("attn.c_attn.bias"):
            (got_q, got_k, got_v), (want_q, want_k, want_v) = np.split(got, 3), np.split(want, 3)
            got, want = np.concatenate([got_q, got_v]), np.concatenate([want_q, want_v])
            assert np.abs(got_k - want_k).max() < 1e-2 * np.abs(want).max(), (name, got_k)
        errors[name] = relative_error(got, want)
    assert max(errors.values()) < 1e-4, sorted(errors.items(), key=lambda e: -e[1])


def momentum(checkpoint: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """The outer momentum buffers of a checkpoint, by parameter name."""
    return {name: checkpoint[f"momentum.{i}"] for i, name in enumerate(names)}


def run_and_load(e2e: Any, settings: dict[str, Any], out: Path) -> Any:
    """Start `pcp train` with `settings`; returns a function that waits and loads its results."""
    run = e2e.pcp("train", "train", *cli_flags(settings), "--out", str(out))

    def results() -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
        assert run.wait(300) == 0, run.output()[-4000:]
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return load_file(out / "checkpoint.safetensors"), records

    return results


ONE_ROUND = COMMON | {"workers": 2, "steps": 5, "inner_steps": 5, "steps_per_call": 5}


def one_round_by_hand(settings: dict[str, Any]) -> tuple[Any, list, list, list, list]:
    """The reference setup, θ0, both workers' local runs, their θ0 − θ_w and Δ, the mean."""
    setup = reference_setup(settings)
    assert setup.program.steps_per_call == 5
    theta0 = setup.initial_params()
    opt0 = setup.program.init_opt_state(theta0)
    local = [local_steps(setup, theta0, opt0, round_=0, worker=w) for w in range(2)]
    deltas = [[t0 - t for t0, t in zip(theta0, params, strict=True)] for params, _, _ in local]
    delta = [(a + b) / 2 for a, b in zip(*deltas, strict=True)]
    return setup, theta0, local, deltas, delta


def test_one_round_outer_nesterov_step_by_hand(e2e: Any, tmp_path: Path) -> None:
    """Two workers, one round of H = 5: θ1 = θ0 − η(Δ + μb), b = Δ = mean of θ0 − θ_w."""
    settings = ONE_ROUND | {"outer_lr": 0.7, "outer_momentum": 0.9}
    results = run_and_load(e2e, settings, tmp_path / "run")

    setup, theta0, local, deltas, delta = one_round_by_hand(settings)
    buffer = delta  # the first step: b = μ·0 + Δ
    theta1 = [t0 - 0.7 * (d + 0.9 * b) for t0, d, b in zip(theta0, delta, buffer, strict=True)]

    checkpoint, records = results()
    names = setup.param_names()
    assert_close(checkpoint, dict(zip(names, theta1, strict=True)))
    assert_close(momentum(checkpoint, names), dict(zip(names, buffer, strict=True)))
    # the two workers saw different data, and the reference saw what each worker saw
    assert min(relative_error(a, b) for a, b in zip(*deltas, strict=True)) > 1e-2
    (record,) = records
    for worker, (_, _, losses) in enumerate(local):
        np.testing.assert_allclose(record["worker_losses"][str(worker)], np.mean(losses), 1e-4)


def test_an_outer_warmup_round_is_the_plain_average(e2e: Any, tmp_path: Path) -> None:
    """--outer-warmup-rounds 1: θ1 = θ0 − Δ, the mean of the workers' models, whatever the
    outer lr and momentum, and the momentum buffer is left untouched (zero)."""
    settings = ONE_ROUND | {"outer_lr": 0.7, "outer_momentum": 0.9, "outer_warmup_rounds": 1}
    results = run_and_load(e2e, settings, tmp_path / "run")

    setup, theta0, _, _, delta = one_round_by_hand(settings)
    checkpoint, _ = results()
    names = setup.param_names()
    expected = [t0 - d for t0, d in zip(theta0, delta, strict=True)]
    assert_close(checkpoint, dict(zip(names, expected, strict=True)))
    assert all(not momentum(checkpoint, names)[name].any() for name in names)


def local_rounds(setup: Any, rounds: int, reset: bool) -> list[list[np.ndarray]]:
    """One worker's params after each of `rounds` rounds of local training, its AdamW
    first moments zeroed before each round with `reset`."""
    params = setup.initial_params()
    opt = setup.program.init_opt_state(params)
    names = [spec.name for spec in setup.program.opt_specs]
    history = [params]
    for round_ in range(rounds):
        if reset:
            first_moment = [name.startswith("opt.mu[") for name in names]
            opt = [np.zeros_like(o) if m else o for m, o in zip(first_moment, opt, strict=True)]
        params, opt, _ = local_steps(setup, params, opt, round_=round_, worker=0)
        history.append(params)
    return history


@pytest.mark.parametrize("inner_momentum", ["reset", "keep"])
def test_one_worker_h1_equals_local_training(e2e: Any, tmp_path: Path, inner_momentum: str) -> None:
    """One worker, H = 1, outer lr 1, momentum 0: each round's params are the worker's,
    whose AdamW first moment starts every round at zero under --inner-momentum reset (the
    default) and carries over under keep."""
    # --steps-per-call 1 is needed: `config.resolve` wants steps % steps_per_call == 0 before
    # DiLoCo's plan would lower steps_per_call to divide H (it would pick 1 here)
    settings = COMMON | {"workers": 1, "steps": 4, "inner_steps": 1, "steps_per_call": 1}
    settings |= {"outer_lr": 1.0, "outer_momentum": 0.0, "inner_momentum": inner_momentum}
    results = run_and_load(e2e, settings, tmp_path / "run")

    setup = reference_setup(settings)
    assert setup.program.steps_per_call == 1
    history = local_rounds(setup, 4, reset=inner_momentum == "reset")
    other = local_rounds(setup, 4, reset=inner_momentum != "reset")[-1]
    params = history[-1]
    # the two references are far enough apart for the wrong one to fail
    assert relative_error(np.concatenate([p.ravel() for p in params]),
                          np.concatenate([p.ravel() for p in other])) > 1e-3  # fmt: skip

    checkpoint, records = results()
    assert [r["workers"] for r in records] == [1] * 4
    names = setup.param_names()
    assert_close(checkpoint, dict(zip(names, params, strict=True)))
    last_delta = [a - b for a, b in zip(history[-2], history[-1], strict=True)]
    assert_close(momentum(checkpoint, names), dict(zip(names, last_delta, strict=True)))
    # the reference moved far enough for a wrong one to fail
    assert relative_error(history[0][0], params[0]) > 1e-2
