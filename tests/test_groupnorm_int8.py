"""The GroupNorm's variance in full int8: the form `to_tflite(quantization="int8")` traces.

`E[x^2]` as the MEAN of `x * x` rounds every square to 8 bits before the mean; with heavy
tails (a few large activations, as after MobileViTv2's attention) most squares round to
zero and the variance comes out too small (docs/int8.md section 6). Full int8 traces it as
one matrix product per sample instead (`export_forms.INT8`, the forms of "int8"), summed in int32.
"""

import dataclasses

import keras
import numpy as np

import keras_mvit2 as mv
from keras_mvit2.export import to_tflite
from keras_mvit2.export.tflite.convert import _concrete_function, _make_converter
from keras_mvit2.export.tflite.inspect import inspect_tflite
from keras_mvit2.export.tflite.run import run_tflite
from keras_mvit2.layers import GroupNorm1, export_forms


def _heavy_tailed(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 16, 16, 32): per sample, values around 1 with +-30 at 0.1 % of the positions,
    times a scale of its own (log-normal, sigma 0.5: images differ). The calibrated range
    of `x * x` is then set by the outliers of the largest samples, and the squares of most
    elements of most samples are below half its step."""
    x = rng.normal(size=(n, 16, 16, 32)).astype("float32")
    outliers = rng.random(x.shape) < 0.001
    x[outliers] = 30.0 * np.sign(x[outliers])
    scale = np.exp(0.5 * rng.normal(size=(n, 1, 1, 1)))
    return ((x + 1.0) * scale).astype("float32")


def _group_norm_numpy(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
                      eps: float) -> np.ndarray:
    """One group: per sample, the mean and (biased) variance over every element."""
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    var = ((x - mean) ** 2).mean(axis=(1, 2, 3), keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _group_norm_in_int8(variance: str, calibration: np.ndarray, path) -> None:
    """A GroupNorm1 alone, traced with `variance`, as a full-int8 file (float I/O),
    calibrated on `calibration` (not images: the converter is driven directly)."""
    inputs = keras.Input(calibration.shape[1:])
    model = keras.Model(inputs, GroupNorm1(name="norm")(inputs))
    with export_forms.tracing(export_forms.ExportForms(variance=variance)):
        function = _concrete_function(model, (1, *calibration.shape[1:]))
        path.write_bytes(_make_converter(function, "int8", "float32", calibration).convert())


def test_int8_variance_as_a_matrix_product_follows_the_formula(tmp_path):
    rng = np.random.default_rng(0)
    calibration, x = _heavy_tailed(rng, 32), _heavy_tailed(rng, 16)
    want = _group_norm_numpy(x, np.ones(32, "float32"), np.zeros(32, "float32"), 1e-5)
    errors = {}
    for variance in ("one_pass", "one_pass_matmul"):
        path = tmp_path / f"{variance}.tflite"
        _group_norm_in_int8(variance, calibration, path)
        assert inspect_tflite(path).float_ops == {}
        got = run_tflite(str(path), x)
        errors[variance] = float(np.abs(got - want).mean() / want.std())
    # Measured: 0.14 (matrix product) against 0.47 (MEAN of int8 squares).
    assert errors["one_pass_matmul"] < 0.2, errors
    assert errors["one_pass"] > 2 * errors["one_pass_matmul"], errors


def test_full_int8_traces_the_matrix_product_unless_the_caller_passes_forms(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3))
    features = mv.models.MobileViTV2Block(16, 2)(keras.layers.Conv2D(16, 3)(inputs))
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(features))
    norms = sum(isinstance(layer, GroupNorm1) for layer in model._flatten_layers())
    assert norms == 5  # two per transformer layer, and the block's last
    images = np.random.default_rng(1).random((8, 32, 32, 3)).astype("float32")
    default = to_tflite(model, tmp_path / "default.tflite", quantization="int8",
                        representative_data=images)
    chosen = to_tflite(model, tmp_path / "chosen.tflite", quantization="int8",
                       representative_data=images, forms=export_forms.KERAS)
    assert default.float_ops == {} == chosen.float_ops
    # One BATCH_MATMUL per GroupNorm1 more, one MEAN fewer.
    histogram, other = default.op_histogram, chosen.op_histogram
    assert histogram["BATCH_MATMUL"] - other["BATCH_MATMUL"] == norms
    assert other["MEAN"] - histogram["MEAN"] == norms
    # Float graphs keep the MEAN form.
    float_file = to_tflite(model, tmp_path / "float.tflite")
    assert float_file.op_histogram["BATCH_MATMUL"] == other["BATCH_MATMUL"]


def test_int8_resolves_to_the_matrix_product_forms_and_the_float_formats_to_keras():
    from keras_mvit2.export.tflite.quantization import TFLITE_QUANTIZATIONS

    assert TFLITE_QUANTIZATIONS["int8"].forms == export_forms.INT8
    assert export_forms.INT8 == dataclasses.replace(
        export_forms.KERAS, variance="one_pass_matmul", flow_epsilon="omit",
        products="small_second")
    for name in ("float32", "float16", "dynamic_int8", "int16x8"):
        assert TFLITE_QUANTIZATIONS[name].forms == export_forms.KERAS, name
