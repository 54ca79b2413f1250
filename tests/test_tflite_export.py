"""TFLite (LiteRT) export of MobileViTv2: builtin ops, rank <= 4, no TRANSPOSE, linear cost, exact.

Each model is converted once per input size (module-scoped fixtures); the
float32 `.tflite` runs in `ai_edge_litert` and is compared with Keras at 1e-4.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mvit2 as mv
from keras_mvit2.export import (
    TFLiteReport,
    UnsupportedOpError,
    inspect_tflite,
    run_tflite,
    to_tflite,
)
from keras_mvit2.layers import GroupNorm1

SEED = 1234
ATOL = 1e-4
VARIABLE_OPS = {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"}
SEPARABLE_ATTENTIONS_050 = 9  # transformer layers of MobileViTV2-0.5: 2 + 4 + 3
PATCH_AREA = 4


def _perturb_normalization(model: keras.Model, seed: int) -> int:
    """Random BN statistics / affine and GN1 affine, so the random model's logits
    depend on the input (and the comparison with TFLite means something)."""
    rng = np.random.default_rng(seed)
    count = 0
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype("float32"))
            layer.beta.assign(rng.normal(0.0, 0.05, c).astype("float32"))
            layer.moving_mean.assign(rng.normal(0.0, 0.05, c).astype("float32"))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, c).astype("float32"))
            count += 1
        elif isinstance(layer, GroupNorm1):
            c = layer.gamma.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype("float32"))
            layer.beta.assign(rng.normal(0.0, 0.05, c).astype("float32"))
            count += 1
    return count


def _images(n: int, height: int, width: int, seed: int) -> np.ndarray:
    """Images in [0, 1]: blocky random colour fields mixed with pixel noise."""
    rng = np.random.default_rng(seed)
    coarse = rng.random((n, 8, 8, 3), dtype=np.float32)
    smooth = np.repeat(np.repeat(coarse, -(-height // 8), 1), -(-width // 8), 2)
    smooth = smooth[:, :height, :width]
    noise = rng.random((n, height, width, 3), dtype=np.float32)
    mix = rng.uniform(0.0, 0.5, (n, 1, 1, 1)).astype("float32")
    return (1.0 - mix) * smooth + mix * noise


def _model(height: int, width: int) -> keras.Model:
    keras.utils.set_random_seed(SEED)
    model = mv.MobileViTV2(0.5, input_shape=(height, width, 3), classifier_activation=None)
    assert _perturb_normalization(model, SEED) > 0
    return model


def _keras_logits(model: keras.Model, x: np.ndarray) -> np.ndarray:
    return np.asarray(model(x, training=False), dtype="float32")


def _batch_matmul_shapes(path) -> list[tuple[tuple, tuple, tuple]]:
    """(lhs, rhs, output) shapes of every BATCH_MATMUL in the file."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    shape = {
        t["index"]: tuple(int(d) for d in t["shape"]) for t in interpreter.get_tensor_details()
    }
    return [
        (shape[op["inputs"][0]], shape[op["inputs"][1]], shape[op["outputs"][0]])
        for op in interpreter._get_ops_details()
        if op["op_name"] == "BATCH_MATMUL"
    ]


def _assert_mobile_clean(report: TFLiteReport) -> None:
    hist = report.op_histogram
    assert report.flex_ops == [], report.flex_ops
    assert report.custom_ops == [], report.custom_ops
    assert not any(op.startswith("Flex") for op in hist), hist
    assert not VARIABLE_OPS & set(hist), hist
    assert hist.get("TRANSPOSE", 0) == 0, hist
    assert report.max_tensor_rank <= 4, report.max_tensor_rank
    # One matrix product per attention: the score-weighted sum over the N tokens
    # (1, N, P)^T x (1, N, P*d) -> (1, P, P*d). Linear in N: nothing is N x N.
    matmuls = _batch_matmul_shapes(report.path)
    assert len(matmuls) == SEPARABLE_ATTENTIONS_050, hist
    for lhs, rhs, out in matmuls:
        tokens, dim = lhs[1], rhs[2] // PATCH_AREA
        assert lhs[2] == PATCH_AREA and rhs[1] == tokens, (lhs, rhs)
        assert out[1:] == (PATCH_AREA, PATCH_AREA * dim), (lhs, rhs, out)


def _assert_logits_informative(logits: np.ndarray) -> None:
    # Not constant across inputs: the spread is far above the tolerance.
    spread = float(np.ptp(logits, axis=0).max())
    assert spread > 100 * ATOL, f"logits nearly constant across inputs (spread {spread:.2e})"
    assert float(np.abs(logits).max()) > 0.1, "logits trivially tiny"


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tflite")


@pytest.fixture(scope="module")
def model_256():
    return _model(256, 256)


@pytest.fixture(scope="module")
def report_256(model_256, out_dir):
    return to_tflite(model_256, out_dir / "mobilevitv2_050_256.tflite")


@pytest.fixture(scope="module")
def images_256():
    return _images(4, 256, 256, seed=1)


def test_mobilevitv2_050_256_converts_builtin_only(report_256, capsys, record_property):
    report = report_256
    hist = report.op_histogram
    summary = {
        "op_histogram": hist,
        "TRANSPOSE": hist.get("TRANSPOSE", 0),
        "num_ops": report.num_ops,
        "max_tensor_rank": report.max_tensor_rank,
        "num_xnnpack_partitions": report.num_xnnpack_partitions,
        "num_ops_outside_xnnpack": report.num_ops_outside_xnnpack,
        "size_bytes": report.size_bytes,
    }
    with capsys.disabled():
        print("\nMobileViTV2-0.5 @256 fp32 TFLite:", json.dumps(summary))
    for key, value in summary.items():
        record_property(key, json.dumps(value))

    _assert_mobile_clean(report)
    assert report.inputs[0].shape == (1, 256, 256, 3)
    assert report.inputs[0].dtype == "float32"
    assert report.outputs[0].shape == (1, 1000)
    assert not report.dynamic_batch
    # The whole graph is one XNNPACK partition (no op falls back to the reference kernels).
    assert report.num_xnnpack_partitions == 1, report.ops_outside_xnnpack
    assert report.num_ops_outside_xnnpack == 0, report.ops_outside_xnnpack
    # The report is JSON-ready and `inspect_tflite` reads the same file back.
    assert json.loads(json.dumps(report.to_dict()))["op_histogram"] == hist
    assert inspect_tflite(report.path) == report
    assert report.size_bytes == os.path.getsize(report.path)
    # The file records the keras_mvit2 version that wrote it (metadata read from the file).
    assert inspect_tflite(report.path).metadata["keras_mvit2_version"] == mv.__version__


def test_mobilevitv2_050_256_matches_keras(model_256, report_256, images_256, record_property):
    expected = _keras_logits(model_256, images_256)
    _assert_logits_informative(expected)
    got = run_tflite(report_256.path, images_256)
    assert got.shape == expected.shape and got.dtype == np.float32
    diff = float(np.abs(got - expected).max())
    record_property("max_abs_diff_256", diff)
    assert diff <= ATOL, diff


# The float32 graph of a MobileViTV2-0.5 built for 256x256 (pointwise fusion on), as it
# was before models could be built for any size: input_shape=(None, None, 3) must not
# change what a fixed-size model converts to.
PINNED_HISTOGRAM_050_256 = {
    "ADD": 61, "BATCH_MATMUL": 9, "CONV_2D": 70, "DEPTHWISE_CONV_2D": 9, "DEPTH_TO_SPACE": 3,
    "EXP": 9, "FULLY_CONNECTED": 1, "LOGISTIC": 25, "MEAN": 61, "MUL": 184,
    "PAD": 5, "REDUCE_MAX": 9, "RESHAPE": 33, "RSQRT": 30, "SPACE_TO_DEPTH": 3, "SUB": 51,
}


def _op_sequence(path) -> list[tuple]:
    """(op, input shapes, output shapes) of every op, in execution order."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    shape = {
        t["index"]: tuple(int(d) for d in t["shape"]) for t in interpreter.get_tensor_details()
    }
    return [
        (op["op_name"], tuple(shape[i] for i in op["inputs"] if i >= 0),
         tuple(shape[i] for i in op["outputs"]))
        for op in interpreter._get_ops_details()
    ]


def test_static_graph_is_pinned(report_256):
    assert report_256.op_histogram == PINNED_HISTOGRAM_050_256


def test_dynamic_model_exports_the_static_graph(model_256, report_256, images_256, out_dir):
    """A model built for any size, exported at 256 (the default), is the fixed-size graph."""
    dynamic = mv.MobileViTV2(0.5, input_shape=(None, None, 3), classifier_activation=None)
    dynamic.set_weights(model_256.get_weights())
    report = to_tflite(dynamic, out_dir / "mobilevitv2_050_dynamic_at_256.tflite")
    assert report.inputs[0].shape == (1, 256, 256, 3)
    assert report.op_histogram == PINNED_HISTOGRAM_050_256
    assert _op_sequence(report.path) == _op_sequence(report_256.path)
    np.testing.assert_array_equal(run_tflite(report.path, images_256),
                                  run_tflite(report_256.path, images_256))
    # The dynamic Keras model itself is still dynamic after the export.
    assert dynamic.input_shape == (None, None, None, 3)


def test_dynamic_model_exports_at_the_size_asked(out_dir):
    keras.utils.set_random_seed(SEED)
    dynamic = mv.MobileViTV2(0.5, input_shape=(None, None, 3), classifier_activation=None)
    assert _perturb_normalization(dynamic, SEED) > 0
    report = to_tflite(dynamic, out_dir / "dynamic_224x288.tflite", image_size=(224, 288))
    _assert_mobile_clean(report)
    assert report.inputs[0].shape == (1, 224, 288, 3)
    # 7x9 last-stage map: the one align-corners resize, as a model built at 224x288.
    assert report.op_histogram == {**PINNED_HISTOGRAM_050_256, "RESIZE_BILINEAR": 1}
    x = _images(2, 224, 288, seed=3)
    diff = float(np.abs(run_tflite(report.path, x) - _keras_logits(dynamic, x)).max())
    assert diff <= ATOL, diff
    with pytest.raises(ValueError, match="fixed at 256"):
        to_tflite(_model(256, 256), out_dir / "never.tflite", image_size=224)
    assert not os.path.exists(out_dir / "never.tflite")


def test_non_square_input_uses_builtin_resize(out_dir, record_property):
    # 224x288: the last stage's 7x9 map is resized to 8x10 (bilinear, align_corners).
    model = _model(224, 288)
    report = to_tflite(model, out_dir / "mobilevitv2_050_224x288.tflite")
    _assert_mobile_clean(report)
    assert report.op_histogram.get("RESIZE_BILINEAR", 0) >= 1, report.op_histogram
    assert report.inputs[0].shape == (1, 224, 288, 3)
    x = _images(3, 224, 288, seed=2)
    expected = _keras_logits(model, x)
    _assert_logits_informative(expected)
    diff = float(np.abs(run_tflite(report.path, x) - expected).max())
    record_property("max_abs_diff_224x288", diff)
    assert diff <= ATOL, diff


def test_dynamic_batch(model_256, images_256, out_dir):
    report = to_tflite(model_256, out_dir / "mobilevitv2_050_256_dynamic.tflite", batch_size=None)
    _assert_mobile_clean(report)
    assert report.dynamic_batch
    assert report.inputs[0].shape_signature == (-1, 256, 256, 3)
    expected = _keras_logits(model_256, images_256[:2])
    got = run_tflite(report.path, images_256[:2])
    assert got.shape == (2, 1000)
    assert float(np.abs(got - expected).max()) <= ATOL


# --------------------------------------------------------------------------------------
# Failure paths (tiny models)


def _flex_model() -> keras.Model:
    # tf.math.cumprod has no TFLite builtin (it would be FlexCumprod); cumsum does.
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 1, name="conv")(inputs)
    x = keras.layers.Lambda(lambda t: tf.math.cumprod(t, axis=1), name="running_product")(x)
    outputs = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, outputs, name="flex_model")


def test_unsupported_op_raises_and_writes_nothing(tmp_path):
    target = tmp_path / "flex.tflite"
    with pytest.raises(UnsupportedOpError, match="Cumprod") as info:
        to_tflite(_flex_model(), target)
    message = str(info.value)
    assert "running_product" in message and "Lambda" in message
    assert "Fix:" in message
    assert info.value.ops == ["Cumprod"]
    assert info.value.layers == ["running_product"]
    assert not target.exists()
    assert os.listdir(tmp_path) == []  # no temporary left behind


@tf.function
def _doubled_in_python(t):
    y = tf.py_function(lambda a: a * 2.0, [t], tf.float32)
    y.set_shape(t.shape)
    return y


def test_unsupported_op_inside_a_function_the_layer_calls_names_the_layer(tmp_path):
    # The op sits in a tf.function the layer calls: the converter's location of the op
    # restarts in the function's body and names no layer; the graph's caller does.
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 1, name="conv")(inputs)
    x = keras.layers.Lambda(_doubled_in_python, name="my_pyfunc")(x)
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))
    with pytest.raises(UnsupportedOpError, match="EagerPyFunc") as info:
        to_tflite(model, tmp_path / "pyfunc.tflite")
    assert info.value.layers == ["my_pyfunc"]
    assert "tf.EagerPyFunc in layer 'my_pyfunc' (Lambda)" in str(info.value)
    assert "layer unknown" not in str(info.value)
    assert os.listdir(tmp_path) == []


def test_inspect_reports_flex_ops(tmp_path):
    # The same model converted *with* SELECT_TF_OPS: the report must show the Flex op,
    # so `flex_ops == []` above is a real check.
    saved_model = str(tmp_path / "saved_model")
    _flex_model().export(
        saved_model,
        format="tf_saved_model",
        input_signature=[keras.InputSpec(shape=(1, 8, 8, 3), dtype="float32")],
        verbose=False,
    )
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model)
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.TFLITE_BUILTINS,
        tf.lite.OpsSet.SELECT_TF_OPS,
    ]
    path = tmp_path / "flex.tflite"
    path.write_bytes(converter.convert())
    report = inspect_tflite(path)
    assert report.flex_ops == ["FlexCumprod"]
    assert report.op_histogram["FlexCumprod"] == 1
    assert report.inputs[0].shape == (1, 8, 8, 3)


def test_failed_conversion_keeps_existing_file(tmp_path):
    target = tmp_path / "model.tflite"
    target.write_bytes(b"previous model")
    with pytest.raises(UnsupportedOpError):
        to_tflite(_flex_model(), target)
    assert target.read_bytes() == b"previous model"
    assert os.listdir(tmp_path) == ["model.tflite"]


def test_nan_output_is_rejected_and_keeps_existing_file(tmp_path):
    # Converts fine but gives NaN at run time: the run-time check must refuse to write it.
    inputs = keras.Input((8, 8, 3))
    outputs = keras.layers.Lambda(lambda t: keras.ops.log(t - 2.0), name="bad_log")(inputs)
    model = keras.Model(inputs, outputs)
    target = tmp_path / "model.tflite"
    target.write_bytes(b"previous model")
    with pytest.raises(RuntimeError, match="non-finite"):
        to_tflite(model, target)
    assert target.read_bytes() == b"previous model"
    assert os.listdir(tmp_path) == ["model.tflite"]


def test_invalid_batch_size(tmp_path):
    with pytest.raises(ValueError, match="Received"):
        to_tflite(_flex_model(), tmp_path / "x.tflite", batch_size=0)
    assert os.listdir(tmp_path) == []
