"""`keras_mvit2.quantize.function_fake_quant` without the QAT worker: the call-site bookkeeping
on plain TensorFlow, with a stand-in layer and ops namespace (the worker passes the tf_keras
shim's; test_qat.py checks the whole QAT file in the slow tier)."""

import types

import numpy as np
import pytest

from keras_mvit2.quantize.function_fake_quant import FUNCTIONS, FunctionFakeQuant

tf = pytest.importorskip("tensorflow")


def _fake_quant_numpy(x, low, high):
    """TensorFlow's FakeQuantWithMinMaxVars (8 bits, wide range), written out."""
    scale = (high - low) / 255.0
    zero_point = np.clip(np.round(-low / scale), 0, 255)
    low, high = -zero_point * scale, (255 - zero_point) * scale
    return np.round((np.clip(x, low, high) - low) / scale) * scale + low


def _moving_avg_quantize(calls):
    def quantize(x, min_var, max_var, *, is_training, **kwargs):
        calls.append(is_training)
        if is_training:  # the worker's EMA (decay 0 here: the batch's own range)
            min_var.assign(tf.minimum(tf.reduce_min(x), 0.0))
            max_var.assign(tf.maximum(tf.reduce_max(x), 0.0))
        return tf.quantization.fake_quant_with_min_max_vars(x, min_var, max_var)

    return quantize


class Block:
    """A stand-in composite layer: two SiLUs and a residual sum, the sum its output."""

    def __init__(self, ops):
        self.ops = ops

    def call(self, x, training=None):
        y = self.ops.silu(x)
        y = self.ops.silu(self.ops.multiply(y, 2.0))
        return self.ops.add(x, y)

    def __call__(self, x, training=None):
        return self.call(x, training=training)


def _setup():
    ops = types.SimpleNamespace(silu=tf.nn.silu, add=tf.add, multiply=tf.multiply)
    blocks = {"a": Block(ops), "b": Block(ops)}

    def model(x, training=None):
        return ops.multiply(blocks["b"](blocks["a"](x, training), training), 0.5)

    calls = []
    hooks = FunctionFakeQuant(tf, ops, lambda: _moving_avg_quantize(calls),
                              tf.__internal__.smart_cond.smart_cond)
    hooks.install(model, list(blocks.items()), output_quantized=["b"], input_shape=(None, 8))
    return ops, blocks, model, hooks, calls


def test_sites_are_named_per_layer_call_and_a_quantized_output_is_left_alone():
    _, _, _, hooks, _ = _setup()
    assert FUNCTIONS == ("silu", "add", "multiply")
    # "b"'s sum is its output, which its wrapper quantizes; "a"'s is not; the model's own
    # multiply is outside every layer
    assert set(hooks.sites) == {"a/silu_0", "a/multiply_0", "a/silu_1", "a/add_0",
                                "b/silu_0", "b/multiply_0", "b/silu_1"}
    assert hooks.skipped == {"b/add_0"}
    assert hooks.summary()["a"] == ["silu_0", "multiply_0", "silu_1", "add_0"]


def test_training_updates_the_ranges_and_inference_rounds_on_them():
    ops, blocks, model, hooks, calls = _setup()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 8)).astype("float32") * 3
    model(tf.constant(x), training=True)
    low, high = (float(v.numpy()) for v in hooks.sites["a/silu_0"])
    expected_silu = x / (1 + np.exp(-x))
    assert low == pytest.approx(min(expected_silu.min(), 0.0), rel=1e-5)
    assert high == pytest.approx(expected_silu.max(), rel=1e-5)
    # inference, in a tf.function: the same variables, no update, the numpy transcription
    calls.clear()
    before = {site: [float(v.numpy()) for v in pair] for site, pair in hooks.sites.items()}
    got = tf.function(lambda t: blocks["a"](t, training=False))(tf.constant(x)).numpy()
    assert calls and not any(calls)
    assert {site: [float(v.numpy()) for v in pair] for site, pair in hooks.sites.items()} == before
    fq = {site: (lambda t, lo=lo, hi=hi: _fake_quant_numpy(t, lo, hi))
          for site, (lo, hi) in before.items()}
    y = fq["a/silu_0"](x / (1 + np.exp(-x)))
    y = fq["a/multiply_0"](y * 2.0)
    y = fq["a/silu_1"](y / (1 + np.exp(-y)))
    np.testing.assert_allclose(got, fq["a/add_0"](x + y), atol=1e-5)
    # outside the layers the functions are the plain ones
    np.testing.assert_allclose(ops.silu(tf.constant(x)).numpy(), x / (1 + np.exp(-x)),
                               rtol=1e-6)
