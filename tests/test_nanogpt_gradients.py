"""The built-in GPT's hand-written gradients against autodiff of the plain formulas.

Layer norm, GELU, the column sums, the q/k/v split and the positions' add have their
backward passes written out (pcp_core/program/layers.py and gelu.py say why: fewer bytes
kept for the backward pass, and reductions GPU targets run well); in f32 they must be the
gradients autodiff gives.
"""

import numpy as np
import pytest

from pcp_core.program import gelu, layers, platform_export


@pytest.fixture(scope="module")
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def vjp(function, inputs, cotangent):
    import jax

    _, pullback = jax.vjp(function, *inputs)
    return pullback(cotangent)


def assert_same_gradients(ours, reference, inputs, cotangent) -> None:
    pairs = zip(vjp(ours, inputs, cotangent), vjp(reference, inputs, cotangent), strict=True)
    for got, expected in pairs:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_layer_norm(rng) -> None:
    def reference(x, weight, bias):
        mean = x.mean(axis=-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return (x - mean) / (variance + 1e-5) ** 0.5 * weight + bias

    inputs = [rng.standard_normal(shape).astype(np.float32) for shape in ((4, 8, 16), (16,), (16,))]
    cotangent = rng.standard_normal((4, 8, 16)).astype(np.float32)
    np.testing.assert_allclose(layers.layer_norm()(*inputs), reference(*inputs), atol=1e-5)
    assert_same_gradients(layers.layer_norm(), reference, inputs, cotangent)


@pytest.mark.parametrize("sigmoid_form", [False, True])
def test_gelu(rng, monkeypatch, sigmoid_form) -> None:
    import jax

    if sigmoid_form:  # the portable trace (platform None) takes the forms of XLA on CUDA
        monkeypatch.setattr(platform_export, "XLA_FORMS_PLATFORM", None)
    x = rng.standard_normal((4, 32)).astype(np.float32) * 3
    cotangent = rng.standard_normal((4, 32)).astype(np.float32)
    reference = lambda x: jax.nn.gelu(x, approximate=True)  # noqa: E731
    np.testing.assert_allclose(gelu.gelu("f32")(x), reference(x), atol=1e-6)
    assert_same_gradients(gelu.gelu("f32"), reference, [x], cotangent)


@pytest.mark.parametrize("shape", [(32, 256, 384), (3, 5, 7), (2, 1024, 48)])
def test_column_sum(rng, shape) -> None:
    g = rng.standard_normal(shape).astype(np.float32)
    expected = g.reshape(-1, shape[-1]).astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(layers.column_sum(g), expected, rtol=1e-4, atol=1e-3)


def test_split_heads(rng) -> None:
    def reference(qkv):
        q, k, v = qkv.reshape(2, 8, 3, 4, 6).transpose(2, 0, 3, 1, 4)
        return q, k, v

    qkv = rng.standard_normal((2, 8, 72)).astype(np.float32)
    cotangents = tuple(rng.standard_normal((2, 4, 8, 6)).astype(np.float32) for _ in range(3))
    for got, expected in zip(layers.split_heads(4)(qkv), reference(qkv), strict=True):
        np.testing.assert_array_equal(got, expected)
    assert_same_gradients(layers.split_heads(4), reference, [qkv], cotangents)


def test_add_positions(rng) -> None:
    inputs = [rng.standard_normal(shape).astype(np.float32) for shape in ((5, 8, 16), (8, 16))]
    cotangent = rng.standard_normal((5, 8, 16)).astype(np.float32)
    np.testing.assert_array_equal(layers.add_positions()(*inputs), inputs[0] + inputs[1])
    assert_same_gradients(layers.add_positions(), lambda x, p: x + p, inputs, cotangent)
