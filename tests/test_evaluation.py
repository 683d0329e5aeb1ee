"""Validation runs through the compiled eval program on the run's backend."""

import numpy as np
import pytest

from pcp_core import plugins
from pcp_core.config import RunConfig
from pcp_core.program.training import prepare


@pytest.mark.parametrize("backend", ["cpu", "xla"])
def test_validation_loss_comes_from_the_backends_executor(backend: str) -> None:
    config = RunConfig(backend=backend, eval_batches=3, batch_size=4).validate()
    setup = prepare(config, plugins.host())
    params = setup.initial_params()
    loss = setup.validation_loss(params)

    executor = setup.evaluator._executor
    expected = {"cpu": "IreeExecutor", "xla": "XlaExecutor"}[backend]
    assert type(executor).__name__ == expected  # built and loaded on the backend
    evaluation = setup.evaluator.build()
    assert evaluation.opt_specs == [] and evaluation.steps_per_call == 3
    x, y = setup.corpus.batches("validation", 3, 4, evaluation.block_size, (0, 0xE7A1))
    *_, jax_losses = evaluation.jax_step(tuple(params), (), x, y)
    np.testing.assert_allclose(loss, float(np.mean(jax_losses)), rtol=1e-5)
    assert abs(loss - np.log(setup.corpus.vocab_size)) < 0.5  # an untrained model's loss

    trained = [p * 0.5 for p in params]  # new parameters replace the last ones
    assert setup.validation_loss(trained) != loss
    assert setup.validation_loss(params) == pytest.approx(loss, rel=1e-6)
