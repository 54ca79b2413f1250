"""Per-layer int8 error ranking (`layer_errors`) and int8 files with layers kept in float.

The broken layer, made from the trained classifier: the classifier (`predictions`, a
Dense on the pooled features) gets, for the input feature it uses least, a weight of
1000 x its largest weight towards every class. That feature is first made exactly 0 (the
last block's `proj_bn` gamma and beta of that channel set to 0: the logits move by less
than 0.1 and at most 1 % of the test predictions, near-ties, change), so the outlier
adds exactly 0 in float: the Keras model is the oracle and computes the same logits with
or without it. In int8 each class's
weight scale becomes outlier / 127, every real weight of the classifier rounds to 0 and the
int8 logits are the bias: the classifier's own quantization error is far above any other
layer's, and only quantization suffers. (Breaking an earlier layer this way also pushes
the layers after it, e.g. the GroupNorm's RSQRT, out of their calibrated ranges, and their
own errors then rise as well.)
"""

import json
import os

import keras
import model_utils
import numpy as np
import pytest
import tiny_model
from shared_fixtures import fashion_mnist_ready, fashion_mnist_rgb

from keras_mvit2.cli.main import main
from keras_mvit2.export.tflite.convert import to_tflite
from keras_mvit2.export.tflite.layer_errors import (
    ROUNDING_ONLY,
    LayerError,
    layer_errors,
    layer_errors_of_file,
    plot_layer_errors,
)
from keras_mvit2.export.tflite.layer_names import LayerNames
from keras_mvit2.export.tflite.run import run_tflite

needs_data = pytest.mark.skipif(not fashion_mnist_ready(), reason="Fashion-MNIST not installed")


@pytest.fixture(scope="module")
def tiny():
    import keras_mvit2 as mv

    keras.utils.set_random_seed(0)
    return mv.MobileViTV2(0.5, input_shape=(32, 32, 3), classes=10, classifier_activation=None)


def _error(name: str, value: float) -> LayerError:
    return LayerError(layer=name, mapped=True, rmse_over_scale=value,
                      max_abs_error_over_scale=2 * value, mean_error_over_scale=0.0,
                      std_error_over_scale=value,
                      num_ops=1, worst_op="CONV_2D", worst_tensor=name, ops=[])


# --------------------------------------------------------------------------------------
# Fast: names, errors, the chart


def test_tensor_names_map_to_keras_layers(tiny):
    names = LayerNames(tiny)
    # Names as TF 2.21 writes them for this model (a conv with its folded batch norm, an
    # op inside a nested layer, a SiLU written in the block's own scope, the output).
    stem = ("mobilevitv2_050_1/stem_bn_1/batchnorm/add_1;mobilevitv2_050_1/stem_conv_1/"
            "convolution;mobilevitv2_050_1/stem_bn_1/batchnorm/sub1")
    assert names.parts(stem) == ["stem_bn", "stem_conv"]
    assert names.owner(stem) == "stem_conv"  # the layer with the kernel
    matmul = "mobilevitv2_050_1/stage3_block1_1/transformer_0_1/attn_1/MatMul"
    assert names.owner(matmul) == "stage3_block1/transformer_0/attn"
    assert names.owner("mobilevitv2_050_1/stage0_block0_1/Sigmoid") == "stage0_block0"
    assert names.owner("Identity") == "predictions"  # the traced function's output
    assert names.owner("Identity_3") is None and names.owner("some_tensor") is None
    assert names.selected(stem, ["stem_bn"]) and names.selected(matmul, ["stage3_block1"])
    assert not names.selected(matmul, ["stage3_block0", "stage3_block1/transformer_1"])


def test_float_layers_errors(tiny, tmp_path):
    images = np.zeros((4, 32, 32, 3), "float32")
    with pytest.raises(ValueError, match="'stage3_block1'"):
        to_tflite(tiny, tmp_path / "m.tflite", quantization="int8",
                  representative_data=images, float_layers=["stage3_blok1"])
    with pytest.raises(ValueError, match="'stage3_block1/transformer_0/attn'"):
        to_tflite(tiny, tmp_path / "m.tflite", quantization="int8",
                  representative_data=images, float_layers=["attn"])
    with pytest.raises(ValueError, match="needs quantization='int8'"):
        to_tflite(tiny, tmp_path / "m.tflite", float_layers=["stem_conv"])
    with pytest.raises(ValueError, match="not one string"):
        to_tflite(tiny, tmp_path / "m.tflite", quantization="int8",
                  representative_data=images, float_layers="stem_conv")
    with pytest.raises(ValueError, match="int8"):
        layer_errors(tiny, images, quantization="int16x8")
    with pytest.raises(ValueError, match="rank_by"):
        layer_errors(tiny, images, rank_by="mse")
    assert not os.path.exists(tmp_path / "m.tflite")


def test_float_layers_check_still_catches_other_float_ops(tmp_path):
    import tensorflow as tf

    # TF 2.21 leaves SQUARE in float in an int8 graph (tests/test_quantization_ptq.py).
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 1, name="first")(inputs)
    x = keras.layers.Lambda(lambda t: tf.math.square(t), name="square")(x)
    x = keras.layers.Conv2D(4, 1, name="last")(x)
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))
    images = np.random.default_rng(0).random((32, 8, 8, 3), dtype=np.float32)
    with pytest.raises(RuntimeError, match=r"SQUARE x1 .*and the ops of float_layers"):
        to_tflite(model, tmp_path / "m.tflite", quantization="int8",
                  representative_data=images, float_layers=["last"])
    assert os.listdir(tmp_path) == []
    report = to_tflite(model, tmp_path / "m.tflite", quantization="int8",
                       representative_data=images, float_layers=["square", "last"],
                       io_dtype="uint8")
    assert report.float_ops["SQUARE"] == 1 and report.float_ops["CONV_2D"] == 1
    assert report.metadata["calibration"]["float_layers"] == ["square", "last"]
    reference = np.asarray(model(images))
    assert np.abs(run_tflite(report.path, images) - reference).max() < 0.05 * np.abs(
        reference).max()
    # The ranking of that recipe leaves the float layers out (no int8 op to measure).
    assert {e.layer for e in layer_errors(model, images[:8])} >= {"first", "last"}
    ranked = layer_errors(model, images[:8], float_layers=["last"])
    assert "first" in {e.layer for e in ranked} and "last" not in {e.layer for e in ranked}


def test_ranking_calibrates_like_the_file_so_matrix_products_are_not_shifted():
    # Calibrated with the converter's own min / max and its zero points, the ranking showed
    # every attention's context product (BATCH_MATMUL) shifted by 5-14 steps. With the
    # file's ranges (the 99.99 % interval, that operand at zero point 0) no product is
    # shifted by more than a step.
    keras.utils.set_random_seed(0)
    model = tiny_model.tiny_mvit2(classes=10, classifier_activation=None)
    rng = np.random.default_rng(0)
    model_utils.spread_affines(model, rng)  # as a trained model's
    images = rng.random((16, 32, 32, 3)).astype("float32")
    ops = [op for error in layer_errors(model, images) for op in error.ops]
    products = [op for op in ops if op["op"] == "BATCH_MATMUL"]
    assert len(products) >= 2  # the two attentions' context products
    assert max(abs(op["mean_error_over_scale"]) for op in products) <= 1.0, products


def test_plot_layer_errors(tmp_path):
    errors = [_error(f"stage{i}_block0", 10.0 / (i + 1)) for i in range(30)]
    path = plot_layer_errors(errors, tmp_path / "chart.png", top=5)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width = matplotlib.image.imread(path).shape[:2]
    assert width == 800 and height == int(100 * (1.2 + 0.3 * 5))  # 5 bars, not 30
    assert json.loads(json.dumps(errors[0].to_dict()))["layer"] == "stage0_block0"
    with pytest.raises(ValueError, match="top"):
        plot_layer_errors(errors, tmp_path / "x.png", top=0)
    with pytest.raises(ValueError, match="metric"):
        plot_layer_errors(errors, tmp_path / "x.png", metric="mse")
    assert not os.path.exists(tmp_path / "x.png")


def test_per_layer_needs_an_int8_file(tmp_path):
    small = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
    float_path = tmp_path / "m.tflite"
    to_tflite(small, float_path)
    images = np.zeros((2, 8, 8, 3), "float32")
    with pytest.raises(ValueError, match=r"full-int8.*'float32'.*--quantization int8"):
        layer_errors_of_file(small, float_path, images)
    with pytest.raises(ValueError, match=r"needs a full-int8 \.tflite"):
        layer_errors_of_file(small, tmp_path / "m.mlpackage", images)


def test_cli_per_layer_refuses_a_float_file(tmp_path, capsys):
    small = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(4, 3),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    small.save(tmp_path / "small.keras")
    to_tflite(small, tmp_path / "small.tflite")
    rc = main(["validate", str(tmp_path / "small.tflite"), "--reference",
               str(tmp_path / "small.keras"), "--data", "fashion_mnist", "--limit", "4",
               "--per-layer"])
    err = capsys.readouterr().err
    assert rc != 0 and "full-int8" in err and "--quantization int8" in err


# --------------------------------------------------------------------------------------
# Slow: the trained classifier with its classifier broken for int8


@pytest.fixture(scope="module")
def broken(trained_classifier_path, tmp_path_factory):
    """(path of the broken .keras, the model, 300 test images)."""
    from keras_mvit2.data.files import load_fashion_mnist_arrays

    model = keras.models.load_model(trained_classifier_path, compile=False)
    x, _ = load_fashion_mnist_arrays("test")
    images = fashion_mnist_rgb(x[:300], 32)
    before = np.asarray(model(images, training=False))
    dense = model.get_layer("predictions")
    kernel = dense.kernel.numpy()  # (features, classes)
    feature = int(np.argmin(np.abs(kernel).sum(axis=1)))
    bn = model.get_layer("stage4_block1").proj_bn
    for weight in (bn.gamma, bn.beta):
        value = weight.numpy()
        value[feature] = 0.0
        weight.assign(value)
    dead = np.asarray(model(images, training=False))
    assert np.abs(dead - before).max() < 0.1  # still sane: a near-tie may flip
    assert np.mean(dead.argmax(-1) == before.argmax(-1)) >= 0.99
    kernel[feature, :] = 1000.0 * np.abs(kernel).max()
    dense.kernel.assign(kernel)
    after = np.asarray(model(images, training=False))
    assert np.array_equal(after, dead)  # the feature is exactly 0: float is unchanged
    path = tmp_path_factory.mktemp("broken") / "broken.keras"
    model.save(path)
    return str(path), model, images


@needs_data
def test_ranking_finds_the_broken_layer(broken):
    _, model, images, = broken
    # Measured on the calibration images themselves: every activation range covers them,
    # so what stands out is an op's own error, not a range the images leave.
    errors = layer_errors(model, images[:80], calibration_data=images[:80],
                          num_calibration_samples=80, rank_by="std_error_over_scale")
    assert errors[0].layer == "predictions" and errors[0].mapped
    assert errors[0].worst_op == "FULLY_CONNECTED"
    # the int8 logits are the bias: the error is the logits' spread, in output steps
    assert errors[0].std_error_over_scale > 20
    assert errors[0].std_error_over_scale > 3 * errors[1].std_error_over_scale
    typical = np.median([e.rmse_over_scale for e in errors])  # most: rounding only
    assert ROUNDING_ONLY * 0.5 < typical < ROUNDING_ONLY * 3
    # Ranked by RMSE / scale (the shift of the attention's BATCH_MATMUL in TF's debug
    # interpreter counts too) it is still first, by a smaller margin.
    by_rmse = sorted(errors, key=lambda e: e.rmse_over_scale, reverse=True)
    assert by_rmse[0].layer == "predictions"
    assert by_rmse[0].rmse_over_scale > 1.5 * by_rmse[1].rmse_over_scale


@needs_data
def test_float_layers_fix_it_and_validate_per_layer_cli(broken, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich: one table row per line
    model_path, model, images = broken
    plain, fixed = str(tmp_path / "int8.tflite"), str(tmp_path / "fixed.tflite")
    common = ["--quantization", "int8", "--calibration-data", "fashion_mnist"]
    assert main(["export", model_path, "-o", plain, *common]) == 0
    assert main(["export", model_path, "-o", fixed, *common, "--io-dtype", "uint8",
                 "--float-layers", "predictions"]) == 0
    capsys.readouterr()

    from keras_mvit2.export.tflite.flatbuffer import (
        decode_name,
        op_names,
        parse_flatbuffer,
        tensor_indices,
    )
    from keras_mvit2.export.tflite.inspect import inspect_tflite

    report = inspect_tflite(fixed)
    assert report.metadata["calibration"]["float_layers"] == ["predictions"]
    assert report.input_dtype == "uint8" and report.output_dtype == "uint8"
    assert report.float_ops == {"DEQUANTIZE": 1, "FULLY_CONNECTED": 1, "QUANTIZE": 1}
    with open(fixed, "rb") as f:
        fb = parse_flatbuffer(f.read())
    graph, kinds = fb.subgraphs[0], op_names(fb)
    float_fc = [op for op in graph.operators if kinds[op.opcodeIndex] == "FULLY_CONNECTED"
                and graph.tensors[tensor_indices(op.outputs)[0]].type == 0]  # FLOAT32
    assert len(float_fc) == 1
    weights = tensor_indices(float_fc[0].inputs)[1]  # the output is renamed (uint8 I/O)
    assert LayerNames(model).owner(decode_name(graph.tensors[weights].name)) == "predictions"
    assert inspect_tflite(plain).float_ops == {}

    reference = np.argmax(np.asarray(model(images, training=False)), -1)
    agree_plain = np.mean(np.argmax(run_tflite(plain, images), -1) == reference)
    agree_fixed = np.mean(np.argmax(run_tflite(fixed, images), -1) == reference)
    assert agree_plain < 0.3 and agree_fixed > 0.9, (agree_plain, agree_fixed)

    report_json = str(tmp_path / "report.json")
    assert main(["validate", plain, "--reference", model_path, "--data", "fashion_mnist",
                 "--limit", "40", "--per-layer", "--per-layer-top", "5",
                 "--json", report_json]) == 0
    printed = capsys.readouterr().out
    table = printed[printed.index("int8 error per Keras layer"):]
    first_row = next(line for line in table.splitlines() if "│ 1 " in line)
    assert "predictions" in first_row and "FULLY_CONNECTED" in first_row
    chart = str(tmp_path / "report.int8.tflite.per_layer.png")
    assert os.path.exists(chart) and "per_layer.png" in printed
    with open(report_json) as f:
        saved = json.load(f)["reports"][0]
    assert saved["per_layer"][0]["layer"] == "predictions"
    assert any("calibrated like the file (fashion_mnist, 200 images)" in n
               for n in saved["notes"])
