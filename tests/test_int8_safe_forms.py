"""Full int8 by any converter: what the Keras model's own call traces (`export_forms.KERAS`).

A user who converts a model with the plain `tf.lite.TFLiteConverter` (`from_keras_model`,
`Optimize.DEFAULT`, a representative dataset, `TFLITE_BUILTINS_INT8`, as TensorFlow's guides
teach) or with Keras' `model.export(format="litert")` gets the graph of `model(x)`, not the
forms `keras_mvit2.export.to_tflite` picks. These tests hold that graph to what such a file
needs:

* the separable attention's normaliser never divides by an int8 sum: the sum of
  `exp(q - max)` over N tokens lies in [1, N], and int8 knows a sum near 1 only to N / 510;
  with a calibrated maximum above 510 the smallest sum rounds to zero, on which LiteRT's
  int8 DIV fails at invoke. The division is two products by `rsqrt(sum)`
  (`functional.divide_positive`), float-exact;
* the trained classifier converted both ways agrees with Keras (slow tier: a checkpoint).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mvit2 as mv
from keras_mvit2.export.tflite.inspect import inspect_tflite
from keras_mvit2.export.tflite.run import run_tflite
from keras_mvit2.layers import functional

#: More than 510 tokens, where a one-token int8 sum rounds to zero: a 384x384 MobileViTV2's
#: stride-8 map (24 x 24 patches of 2 x 2 pixels), here one pixel position per token and 8
#: channels.
TOKENS, DIM = 576, 8


def _plain_int8(model: keras.Model, calibration: np.ndarray) -> bytes:
    """Full int8 the way TensorFlow's guides teach it (float I/O)."""
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([sample[None]] for sample in calibration)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return converter.convert()


def _attention_numpy(layer: mv.layers.SeparableSelfAttention, x: np.ndarray) -> np.ndarray:
    """MobileViTv2 eq. 3 of `(B, N, P, d)` tokens, in float64."""
    x = x.astype("float64")
    kernel = np.asarray(layer.qkv_proj.kernel, "float64")[0, 0]      # (d, 1 + 2d)
    bias = np.asarray(layer.qkv_proj.bias, "float64")
    d = x.shape[-1]
    qkv = x @ kernel + bias
    query, key, value = qkv[..., :1], qkv[..., 1:1 + d], qkv[..., 1 + d:]
    scores = np.exp(query - query.max(axis=1, keepdims=True))
    scores /= scores.sum(axis=1, keepdims=True)
    context = (scores * key).sum(axis=1, keepdims=True)
    out_kernel = np.asarray(layer.out_proj.kernel, "float64")[0, 0]
    return (np.maximum(value, 0.0) * context) @ out_kernel + np.asarray(layer.out_proj.bias)


def _peaked_attention(seed: int = 0) -> keras.Model:
    """One separable attention over `TOKENS` tokens whose query is `20 * x[..., 0]`: a
    sample with channel 0 all zero spreads its scores evenly (sum N), one with a single 1
    there gives that token all the weight (sum 1)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((TOKENS, 1, DIM))
    layer = mv.layers.SeparableSelfAttention(name="attn")
    model = keras.Model(inputs, layer(inputs))
    kernel = np.array(layer.qkv_proj.kernel)
    kernel[..., 0] = 0.0
    kernel[0, 0, 0, 0] = 20.0
    layer.qkv_proj.kernel.assign(kernel)
    return model


def _tokens(rng: np.random.Generator, count: int, peaked: bool) -> np.ndarray:
    x = rng.normal(size=(count, TOKENS, 1, DIM)).astype("float32")
    x[..., 0] = 0.0
    if peaked:
        x[np.arange(count), rng.integers(0, TOKENS, count), 0, 0] = 1.0
    return x


def test_the_token_sum_division_is_two_products_by_its_rsqrt(rng):
    values = rng.normal(size=(2, 1, 4, 8)).astype("float32")
    total = rng.uniform(1.0, 600.0, (2, 1, 4, 1)).astype("float32")
    got = keras.ops.convert_to_numpy(functional.divide_positive(
        tf.constant(values), tf.constant(total)))
    np.testing.assert_allclose(got, values / total, rtol=1e-6, atol=0)
    # The layer over 576 tokens and over 16: eq. 3 within 1e-5.
    for tokens in (TOKENS, 16):
        layer = mv.layers.SeparableSelfAttention()
        x = rng.normal(size=(2, tokens, 4, DIM)).astype("float32")
        layer.build(x.shape)
        layer.qkv_proj.bias.assign(rng.normal(0, 0.1, layer.qkv_proj.bias.shape))
        got = keras.ops.convert_to_numpy(layer(x))
        np.testing.assert_allclose(got, _attention_numpy(layer, x), atol=1e-5)


def test_plain_converter_int8_never_divides_by_a_zero_token_sum(tmp_path, monkeypatch):
    """Calibrated on evenly spread scores (sum 576) and on one-token ones, the int8 sum's
    step is 576 / 255 > 2 and a one-token sum rounds to zero. The division fails on it in
    LiteRT; the products run and follow the attention's output."""
    rng = np.random.default_rng(0)
    calibration = np.concatenate([_tokens(rng, 8, peaked=False), _tokens(rng, 8, peaked=True)])
    peaked = _tokens(rng, 4, peaked=True)
    model = _peaked_attention()
    want = np.asarray(model.predict(peaked, verbose=0))

    safe = tmp_path / "products.tflite"
    safe.write_bytes(_plain_int8(model, calibration))
    report = inspect_tflite(safe)
    assert report.float_ops == {}
    assert "DIV" not in report.op_histogram and report.op_histogram["RSQRT"] == 1
    # The zero sum saturates RSQRT to its calibrated maximum, rsqrt(1): the one token's
    # values. Measured: mean error 0.18 of the mean magnitude, correlation 0.99.
    got = run_tflite(safe, peaked)
    error = np.abs(got - want).mean() / np.abs(want).mean()
    assert error < 0.3 and np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.95, error

    # The same model traced with a division by the sum: the int8 sum of a one-token sample
    # is zero and the invoke fails.
    monkeypatch.setattr(functional, "divide_positive", lambda values, total: values / total)
    divided = tmp_path / "division.tflite"
    divided.write_bytes(_plain_int8(_peaked_attention(), calibration))
    assert inspect_tflite(divided).op_histogram["DIV"] == 1
    with pytest.raises(RuntimeError, match="DIV"):
        run_tflite(divided, peaked)


@pytest.fixture(scope="module")
def classifier_data(trained_classifier_path):
    """The trained classifier (32x32) and Fashion-MNIST: 200 calibration images from the
    end of the training split (outside the fitted ones) and 500 test images, with the
    Keras logits of those."""
    from shared_fixtures import CLASSIFIER_SIZE, fashion_mnist_rgb

    from keras_mvit2.data import load_fashion_mnist_arrays

    model = keras.saving.load_model(trained_classifier_path, compile=False)
    x_train, _ = load_fashion_mnist_arrays("train")
    x_test, _ = load_fashion_mnist_arrays("test")
    calibration = fashion_mnist_rgb(x_train[-200:], CLASSIFIER_SIZE)
    images = fashion_mnist_rgb(x_test[:500], CLASSIFIER_SIZE)
    return model, calibration, images, np.asarray(model.predict(images, verbose=0))


def test_plain_converter_int8_of_the_classifier_agrees_with_keras(classifier_data, tmp_path):
    """Measured: 97.6 % agreement (500 images), no float op."""
    model, calibration, images, reference = classifier_data
    path = tmp_path / "plain.tflite"
    path.write_bytes(_plain_int8(model, calibration))
    report = inspect_tflite(path)
    assert report.float_ops == {} and report.flex_ops == [] and report.custom_ops == []
    agreement = np.mean(run_tflite(path, images).argmax(1) == reference.argmax(1))
    assert agreement >= 0.95, agreement


def test_keras_litert_export_int8_of_the_classifier_agrees_with_keras(classifier_data,
                                                                       tmp_path):
    """Keras' own LiteRT export (`model.export(format="litert")`, the converter's settings
    as keyword arguments) traces the same call. Measured: 97.6 % agreement."""
    model, calibration, images, reference = classifier_data
    path = str(tmp_path / "keras_litert.tflite")
    model.export(path, format="litert", verbose=False,
                 optimizations=[tf.lite.Optimize.DEFAULT],
                 representative_dataset=lambda: ([x[None]] for x in calibration),
                 target_spec={"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]})
    report = inspect_tflite(path)
    assert report.float_ops == {} and report.flex_ops == [] and report.custom_ops == []
    agreement = np.mean(run_tflite(path, images).argmax(1) == reference.argmax(1))
    assert agreement >= 0.95, agreement
