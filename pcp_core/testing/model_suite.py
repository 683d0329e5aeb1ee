"""The model conformance suite. A model package proves itself in three lines:

    class TestMyModel(ModelConformance):
        model_name = "mine"

It checks that the model's config merges overrides into its defaults and refuses bad
ones, that its named sizes are valid and its `shapes` (if any) are what init makes,
that init is deterministic in the seed and float32, that the loss at init is a finite
scalar near ln(vocabulary) (an untrained model guesses uniformly), that its key/value
cache (`decode`, if any) gives `logits`' numbers, and that the reference train program
built with it (AdamW, a few steps) compiles for the CPU backend, matches JAX there and
lowers the loss.
"""

import math
from typing import Any, ClassVar

import numpy as np
import pytest

from pcp_core.testing.reference import assert_matches_jax, initial_params, on_cpu, reference


class ModelConformance:
    model_name: ClassVar[str]
    # small settings for the reference run; the model must take a `vocab_size` setting
    small_config: ClassVar[dict[str, int]] = {"block_size": 16}
    rtol: ClassVar[float] = 1e-4

    @pytest.fixture
    def model(self) -> Any:
        from pcp_core import plugins

        return plugins.host().model(self.model_name)

    def run(self) -> tuple[Any, dict[str, int], Any]:
        return reference(model=self.model_name, overrides=tuple(self.small_config.items()))

    def test_config_merges_defaults_and_refuses_bad_values(self, model: Any) -> None:
        assert model.name == self.model_name and "block_size" in model.defaults
        config = model.config(self.small_config)
        assert {**model.defaults, **self.small_config} == config
        with pytest.raises(ValueError):
            model.config({"block_size": -1})
        with pytest.raises(ValueError):
            model.config({"no_such_setting": 1})

    def test_init_is_float32_and_deterministic(self, model: Any) -> None:
        config = model.config(self.small_config)
        first, again, other = model.init(config, 0), model.init(config, 0), model.init(config, 1)
        assert list(first) == list(again) and first
        for name, value in first.items():
            assert value.dtype == np.float32, f"{name} is {value.dtype}"
            np.testing.assert_array_equal(value, again[name])
        assert any(not np.array_equal(first[n], other[n]) for n in first), "seed is ignored"

    def test_named_sizes_and_shapes_agree_with_init(self, model: Any) -> None:
        """Every preset (`--model-size`) is a valid config; `shapes`, if given, is init's."""
        for name in model.presets:
            model.config({}, preset=name)
        if model.shapes is not None:
            config = model.config(self.small_config)
            made = {name: value.shape for name, value in model.init(config, 0).items()}
            shapes = model.shapes(config)
            assert list(shapes) == list(made) and shapes == made

    def test_loss_at_init_is_near_uniform(self, model: Any) -> None:
        corpus, config, _ = self.run()
        x, y = corpus.batches("train", 1, 4, config["block_size"], (0, 0))
        with on_cpu():
            loss = float(model.loss(config, model.init(config, 0), x[0], y[0]))
        assert math.isfinite(loss)
        assert abs(loss - math.log(corpus.vocab_size)) < 1.0, f"loss {loss} at init"

    def test_decode_gives_the_logits_position_by_position(self, model: Any) -> None:
        """A model with a key/value cache (`decode`): a prefill of a padded window, then
        one token at a time, as `pcp sample --backend` calls it, give `logits`' numbers."""
        if model.decode is None or model.cache_shape is None:
            pytest.skip(f"model {model.name!r} has no decode")
        import jax
        import jax.numpy as jnp

        config = model.config({**self.small_config, "vocab_size": 30})
        params = model.init(config, 3)
        block, prompt = config["block_size"], config["block_size"] // 2
        ids = np.random.default_rng(0).integers(0, 30, (1, block)).astype(np.int32)
        with on_cpu():
            full = np.asarray(model.logits(config, params, jnp.asarray(ids)))[0]
            decode = jax.jit(lambda cache, tokens, start, last: model.decode(
                config, params, cache, tokens, start, last))  # fmt: skip
            window = np.where(np.arange(block) < prompt, ids, 0).astype(np.int32)
            cache = jnp.zeros(model.cache_shape(config, 1), jnp.float32)
            logits, cache = decode(cache, window, 0, prompt - 1)
            np.testing.assert_allclose(logits[0], full[prompt - 1], rtol=0, atol=self.rtol)
            for position in range(prompt, block):
                token = ids[:, position : position + 1]
                logits, cache = decode(cache, token, position, 0)
                np.testing.assert_allclose(logits[0], full[position], rtol=0, atol=self.rtol)

    def test_trains_on_the_cpu_backend(self) -> None:
        from pcp_core import plugins
        from pcp_core.iree.compiler import compile_program

        run = self.run()
        cpu = plugins.host().backend("cpu")
        vmfb = compile_program(run[2].stablehlo, cpu, cpu.resolve_arch()).vmfb
        params = initial_params(run[1], self.model_name)
        losses = assert_matches_jax(cpu, vmfb, run, params, self.rtol)
        assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
