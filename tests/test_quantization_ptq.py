"""Post-training quantization of MobileViTV2-0.5 to TFLite, checked in LiteRT on real images.

The run's trained classifier (tests/shared_fixtures.py, built once per pytest run and
shared with the other modules that need a trained model) is MobileViTV2-0.5 fitted on
Fashion-MNIST at 32x32 (RGB by channel repeat, 160 steps of 64 images: 80-82 % test
accuracy): int8 checks on random weights prove nothing (the activations vanish and int8
outputs go constant). Every quantization mode converts that model and runs in
``ai_edge_litert`` on 1,000 held-out test images (the full-int8 models on all 10,000: on
1,000 the standard error of an accuracy drop is about 0.5 points, which made a 1-point
bound flaky). At the real 256x256 size, the full-int8 model is converted and inspected, and
the separable attention, alone on its real inputs, is held to float at 256 tokens.

Thresholds (measured on this recipe, with margin): int8 top-1 agreement with Keras
>= 0.96 (measured 0.972-0.983) and test-accuracy drop <= 1.0 point (measured -0.3 to
+0.2 on 10,000 images); dynamic-range int8 agreement >= 0.98 (measured
0.991-0.994); float16 >= 0.995 (measured 1.0); float32 max |diff| <= 1e-4; int16x8 agreement >= 0.98
(measured 0.99; the attention's normaliser is N * mean because LiteRT 2.3's int16 SUM
kernel is wrong) and closer to Keras than int8.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from model_utils import float_ops_from_interpreter
from shared_fixtures import (
    CHECKPOINTS,
    CLASSIFIER_BATCH,
    CLASSIFIER_SIZE,
    CLASSIFIER_STEPS,
    fashion_mnist_rgb,
)

import keras_mvit2 as mv
from keras_mvit2.data.files import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_DIR,
    load_fashion_mnist_arrays,
)
from keras_mvit2.export import (
    UnsupportedOpError,
    calibration_images,
    inspect_tflite,
    read_tflite_metadata,
    run_tflite,
    to_tflite,
)
from keras_mvit2.layers import GroupNorm1

CLASSES = list(FASHION_MNIST_CLASSES)
SIZE = CLASSIFIER_SIZE
TRAIN_STEPS = CLASSIFIER_STEPS
BATCH = CLASSIFIER_BATCH
NUM_TEST = 1000
NUM_CALIBRATION = 200
#: Images of the full-int8 conversion at 256x256 (the slowest step of this module: each
#: calibration image is a float run of the reference kernels, each test image a Keras and
#: a LiteRT run at 256x256).
NUM_TEST_256, NUM_CALIBRATION_256 = 96, 32

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(FASHION_MNIST_DIR, "t10k-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)


_rgb = fashion_mnist_rgb


@pytest.fixture(scope="module")
def data():
    x_train, y_train = load_fashion_mnist_arrays("train")
    x_test, y_test = load_fashion_mnist_arrays("test")
    y_train, y_test = y_train.astype("int64"), y_test.astype("int64")
    n = TRAIN_STEPS * BATCH
    return {
        "x_train": x_train[:n], "y_train": y_train[:n],
        # calibration images: training distribution, outside the fitted subset
        "x_cal": x_train[-NUM_CALIBRATION:],
        "x_test": x_test, "y_test": y_test,
    }


@pytest.fixture(scope="module")
def trained(trained_classifier_path):
    """MobileViTV2-0.5 (logits) fitted on Fashion-MNIST at 32x32: the run's trained
    classifier (conftest.py), fitted on `data()["x_train"]`."""
    return keras.saving.load_model(trained_classifier_path)


@pytest.fixture(scope="module")
def test_set(data, trained):
    x = _rgb(data["x_test"], SIZE)
    logits = np.asarray(trained.predict(x, batch_size=250, verbose=0), dtype="float32")
    accuracy = float(np.mean(logits.argmax(-1) == data["y_test"]))
    assert accuracy > 0.7, f"the fixture model did not learn (test accuracy {accuracy:.3f})"
    return {"x": x, "y": data["y_test"], "logits": logits, "accuracy": accuracy}


@pytest.fixture(scope="module")
def calibration(data):
    return _rgb(data["x_cal"], SIZE)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ptq")


def _assert_builtin_only(report) -> None:
    assert report.flex_ops == [] and report.custom_ops == [], (report.flex_ops, report.custom_ops)
    assert not {"VAR_HANDLE", "READ_VARIABLE"} & set(report.op_histogram)


# (quantization, io_dtype, batch_size, minimum top-1 agreement with Keras)
FORMATS = [
    ("float32", "float32", 1, 1.0),
    ("float16", "float32", 1, 0.995),
    ("dynamic_int8", "float32", 1, 0.98),
    ("int8", "float32", 1, 0.96),
    ("int8", "int8", 1, 0.96),
    ("int8", "uint8", None, 0.96),
    ("int16x8", "float32", 1, 0.98),
    ("int16x8", "int16", 1, 0.98),
]


@pytest.fixture(scope="module")
def converted(trained, calibration, out_dir):
    """Lazily converted models, one per (quantization, io_dtype, batch_size)."""
    cache = {}

    def get(quantization, io_dtype, batch_size):
        key = (quantization, io_dtype, batch_size)
        if key not in cache:
            calibrated = quantization in ("int8", "int16x8")
            name = f"fm_{quantization}_{io_dtype}_{'dyn' if batch_size is None else batch_size}"
            cache[key] = to_tflite(
                trained,
                out_dir / f"{name}.tflite",
                quantization=quantization,
                io_dtype=io_dtype,
                batch_size=batch_size,
                representative_data=calibration if calibrated else None,
                class_names=CLASSES,
                sidecar=(quantization == "int8" and io_dtype == "uint8"),
            )
        return cache[key]

    return get


@pytest.fixture(scope="module")
def outputs(converted, test_set):
    """LiteRT's outputs of each converted model on the test images (all 10,000 for full
    int8, the first `NUM_TEST` otherwise), run once and shared by the tests that read them."""
    cache = {}

    def get(quantization, io_dtype, batch_size):
        key = (quantization, io_dtype, batch_size)
        if key not in cache:
            n = len(test_set["y"]) if quantization == "int8" else NUM_TEST
            cache[key] = run_tflite(converted(*key).path, test_set["x"][:n])
        return cache[key]

    return get


@pytest.mark.parametrize(
    "quantization, io_dtype, batch_size, min_agreement",
    FORMATS,
    ids=[f"{q}-{io}-{'dyn' if b is None else b}" for q, io, b, _ in FORMATS],
)
def test_format_converts_and_runs_on_real_images(
    converted, outputs, test_set, quantization, io_dtype, batch_size, min_agreement,
    record_property,
):
    report = converted(quantization, io_dtype, batch_size)
    _assert_builtin_only(report)
    assert report.inputs[0].dtype == io_dtype and report.outputs[0].dtype == io_dtype
    assert report.inputs[0].shape_signature == ((-1 if batch_size is None else 1), SIZE, SIZE, 3)
    assert report.dynamic_batch == (batch_size is None)
    assert report.quantization == quantization
    if io_dtype != "float32":
        assert report.inputs[0].quantization[0] > 0 and report.outputs[0].quantization[0] > 0
    if (quantization, io_dtype) == ("int8", "int8"):
        # Input range pinned to [0, 1]: raw pixels minus 128 are the int8 input.
        assert report.inputs[0].quantization == (pytest.approx(1 / 255), -128)

    got = outputs(quantization, io_dtype, batch_size)
    n = len(got)
    assert n == (len(test_set["y"]) if quantization == "int8" else NUM_TEST)
    ref, labels = test_set["logits"][:n], test_set["y"][:n]
    keras_accuracy = float(np.mean(ref.argmax(-1) == labels))
    assert got.shape == ref.shape and np.all(np.isfinite(got))
    agreement = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
    accuracy = float(np.mean(got.argmax(-1) == labels))
    max_diff = float(np.abs(got - ref).max())
    for key, value in {
        "agreement": agreement, "accuracy": accuracy, "keras_accuracy": keras_accuracy,
        "max_abs_diff": max_diff, "size_bytes": report.size_bytes,
        "op_histogram": report.op_histogram, "float_ops": report.float_ops,
        "xnnpack_partitions": report.num_xnnpack_partitions,
        "ops_outside_xnnpack": report.ops_outside_xnnpack,
    }.items():
        record_property(key, json.dumps(value))

    if quantization == "float32":
        assert max_diff <= 1e-4, max_diff
    if min_agreement is not None:
        assert agreement >= min_agreement, (agreement, accuracy, keras_accuracy)
    if quantization == "int8":
        # Full integer: nothing left in float but the I/O boundary.
        assert report.float_ops == {}, report.float_ops
        assert float_ops_from_interpreter(report.path) == {}
        assert keras_accuracy - accuracy <= 0.01, (accuracy, keras_accuracy)
    if quantization == "int16x8":
        # Ops without an int16x8 kernel in TF 2.21 stay float (listed), nothing else.
        allowed = {"SPACE_TO_DEPTH", "DEPTH_TO_SPACE", "DIV", "QUANTIZE", "DEQUANTIZE"}
        assert set(report.float_ops) <= allowed, report.float_ops
        assert report.float_ops == float_ops_from_interpreter(report.path)
    if quantization in ("float32", "float16", "dynamic_int8"):
        # Float models: the float-op list is the (non-empty) float graph, same as LiteRT sees.
        assert report.float_ops and report.float_ops == float_ops_from_interpreter(report.path)


def test_float_ops_are_detected_in_a_mixed_model(tmp_path):
    # TF 2.21 leaves SQUARE in float in an int8 graph (DEQUANTIZE -> SQUARE -> QUANTIZE):
    # the default must refuse such a model, allow_float_ops=True must keep it and list it.
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 1)(inputs)
    x = keras.layers.Lambda(lambda t: tf.math.square(t), name="square")(x)
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))
    images = np.random.default_rng(0).random((64, 8, 8, 3), dtype=np.float32)
    with pytest.raises(RuntimeError, match="SQUARE x1"):
        to_tflite(model, tmp_path / "strict.tflite", quantization="int8",
                  representative_data=images)
    assert os.listdir(tmp_path) == []
    path = tmp_path / "mixed.tflite"
    report = to_tflite(
        model, path, quantization="int8", representative_data=images, allow_float_ops=True
    )
    assert report.float_ops["SQUARE"] == 1
    assert report.float_ops == float_ops_from_interpreter(path)
    assert "DEQUANTIZE" in report.float_ops  # the island's way into float


@pytest.fixture(scope="module")
def at_256(trained):
    """The fixture model's weights in a 256x256 MobileViTV2-0.5 (no weight of MobileViTv2
    depends on the input size): stage 3's attention sees 256 tokens, as deployed."""
    model = mv.MobileViTV2(0.5, input_shape=(256, 256, 3), classes=10, classifier_activation=None)
    model.set_weights(trained.get_weights())
    return model


@pytest.fixture(scope="module")
def finetuned_256():
    """The trained classifier fine-tuned briefly at 256x256, so that its activations are
    those of a model trained at that size: the committed checkpoint
    `tests/data/checkpoints/classifier_256.weights.h5` (tests/make_checkpoints.py: 40 steps
    of 16 training images, Adam 3e-4, seed 0)."""
    model = mv.MobileViTV2(0.5, input_shape=(256, 256, 3), classes=10, classifier_activation=None)
    model.load_weights(CHECKPOINTS / "classifier_256.weights.h5")
    return model


@pytest.mark.slow  # a full-int8 conversion at 256x256 (~35 s)
def test_int8_at_256_holds_builtin_integer_ops_of_rank_4(finetuned_256, data, out_dir,
                                                         record_property):
    """Full int8 at 256x256, the deployment size, with the default activation ranges
    (per-tensor 99.99 % intervals), on a model fine-tuned at that size: builtin integer ops
    only, of rank <= 4, the attentions' token sums as matrix products; it runs in LiteRT on
    real images. Its agreement with Keras is recorded (on `NUM_TEST_256` test images, with
    `NUM_CALIBRATION_256` calibration images: what is asserted is the program, which the
    numbers of images do not change; the measure is the benchmark's, below).

    Whether the default ranges follow the float model better than the converter's global
    min / max at this size is measured where it can be told apart, by
    `benchmarks/int8_fidelity.py` (MobileViTV2-0.5 trained from scratch at 256x256, three
    seeds, 1,000 test images; `benchmarks/results/int8_fidelity.json`): agreement with Keras
    97.9 / 93.5 / 90.4 % against min / max's 96.6 / 43.3 / 80.3 %, logit relative error
    0.08 / 0.13 / 0.19 against 0.11 / 0.76 / 0.29. This checkpoint is a low-margin model
    (35-51 % top-1): over seven of its trainings neither measure moved the same way every
    time, so the comparison is the benchmark's, not this test's."""
    x = _rgb(data["x_test"][:NUM_TEST_256], 256)
    reference = np.asarray(finetuned_256.predict(x, batch_size=16, verbose=0))
    calibration = _rgb(data["x_cal"][:NUM_CALIBRATION_256], 256)
    report = to_tflite(finetuned_256, out_dir / "fm_int8_256.tflite", quantization="int8",
                       representative_data=calibration)
    _assert_builtin_only(report)
    assert report.float_ops == {} and float_ops_from_interpreter(report.path) == {}
    assert report.max_tensor_rank <= 4
    assert report.op_histogram.get("BATCH_MATMUL", 0) >= 9  # the attention's token sums
    out = run_tflite(report.path, x)
    assert out.shape == reference.shape and np.isfinite(out).all()
    record_property("op_histogram_256_int8", json.dumps(report.op_histogram))
    record_property("xnnpack_partitions_256_int8", report.num_xnnpack_partitions)
    record_property("ops_outside_xnnpack_256_int8", json.dumps(report.ops_outside_xnnpack))
    record_property("agreement_256_int8",
                    float(np.mean(out.argmax(1) == reference.argmax(1))))
    record_property("logit_rel_error_256_int8", float(np.sqrt(
        ((out - reference) ** 2).mean() / (reference ** 2).mean())))


def _output_fidelity(got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """corr: correlation of the centred outputs; relative_error: mean |got - ref| over the
    std of `ref`."""
    a, b = (got - got.mean()).ravel(), (ref - ref.mean()).ravel()
    return {
        "corr": float(a @ b / np.sqrt((a @ a) * (b @ b))),
        "relative_error": float(np.abs(got - ref).mean() / ref.std()),
    }


def _attention_in_full_int8(model, calibration, path, token_pooling: str) -> None:
    """`model` (an attention layer alone) as a full-int8 TFLite file (float I/O), traced with
    `token_pooling`, calibrated on its real inputs `calibration` (not images: `to_tflite`
    pins an image input's range to [0, 1], so the converter is driven directly)."""
    from keras_mvit2.export.tflite.convert import _concrete_function, _make_converter
    from keras_mvit2.layers import export_forms

    with export_forms.tracing(export_forms.ExportForms(token_pooling=token_pooling)):
        function = _concrete_function(model, (1, *calibration.shape[1:]))
        path.write_bytes(_make_converter(function, "int8", "float32", calibration).convert())


def test_int8_attention_follows_float_at_256_tokens(at_256, data, tmp_path, record_property):
    """The separable attention in full int8 at the deployment size, on its real inputs.

    The first layer of stage 3 (256 tokens at 256x256), alone, calibrated and run on the
    inputs the trained model gives it for Fashion-MNIST images, against the same layer in
    Keras. The default form (the token sum as one BATCH_MATMUL: int32 sums of
    `exp(q - max) * x`, one division after) must follow float closely: correlation
    0.997-0.999 and relative error 0.043-0.056 over 9 trainings. The product-and-mean form
    (`mean_N(e * x) * N`, which Core ML traces) is the control the bars must reject: in full
    int8 it gives correlation 0.24-0.55 and relative error 0.73-0.76. (At stage 4's 64
    tokens the default form's error depends more on the training: correlation 0.990-0.998.)
    The whole network's int8 logits at 256x256 are not the measure: they depend on how well
    the model is trained at that size (correlation 0.68-0.99 over 7 briefly fine-tuned
    models, whatever the attention's form).
    """
    from keras_mvit2.models import MobileViTV2Block

    block = next(layer for layer in at_256.layers if isinstance(layer, MobileViTV2Block))
    first = block.transformer[0]
    features = keras.Model(at_256.input, block.input)

    def attention_inputs(images):
        x = features.predict(_rgb(images, 256), batch_size=16, verbose=0)
        return np.asarray(first.norm1(block.patch_tokens(x)))  # (B, N, P, d)

    calibration = attention_inputs(data["x_cal"][:64])
    x = attention_inputs(data["x_test"][:64])
    assert x.shape[1:] == (256, 4, 64), x.shape  # (tokens, pixels of a patch, channels)
    inputs = keras.Input(x.shape[1:])
    attention = keras.Model(inputs, first.attn(inputs))
    ref = np.asarray(attention.predict(x, verbose=0))

    fidelity = {}
    for pooling in ("matmul", "product_mean"):
        path = tmp_path / f"attention_{pooling}.tflite"
        _attention_in_full_int8(attention, calibration, path, pooling)
        assert inspect_tflite(path).float_ops == {}
        fidelity[pooling] = _output_fidelity(run_tflite(path, x), ref)
        for key, value in fidelity[pooling].items():
            record_property(f"{pooling}_{key}", value)

    def meets_bars(f):
        return f["corr"] >= 0.99 and f["relative_error"] <= 0.1

    assert meets_bars(fidelity["matmul"]), fidelity
    assert not meets_bars(fidelity["product_mean"]), fidelity  # the bars reject that form


def test_int16x8_is_closer_to_keras_than_int8(outputs, test_set):
    ref = test_set["logits"][:NUM_TEST]
    int16 = outputs("int16x8", "float32", 1)[:NUM_TEST]
    int8 = outputs("int8", "float32", 1)[:NUM_TEST]
    agreement16 = float(np.mean(int16.argmax(-1) == ref.argmax(-1)))
    agreement8 = float(np.mean(int8.argmax(-1) == ref.argmax(-1)))
    assert agreement16 >= max(agreement8, 0.98), (agreement16, agreement8)


def test_metadata_round_trip(converted, trained):
    report = converted("int8", "uint8", None)
    meta = read_tflite_metadata(report.path)
    assert meta == report.metadata
    with open(report.path + ".json") as f:
        assert json.load(f) == meta  # the sidecar holds the same document
    assert meta["format"] == "keras_mvit2.tflite_metadata" and meta["version"] == 1
    assert meta["model"] == trained.name
    assert meta["keras_mvit2_version"] == mv.__version__
    assert meta["quantization"] == "int8" and meta["batch_size"] is None
    assert meta["class_names"] == CLASSES
    assert meta["output_kind"] == "logits"
    pre = meta["preprocessing"]
    assert pre["color_space"] == "RGB" and pre["layout"] == "NHWC"
    assert pre["input_size"] == [SIZE, SIZE] and pre["scale"] == pytest.approx(1 / 255)
    assert meta["calibration"]["num_samples"] == NUM_CALIBRATION
    # I/O quantization parameters equal the interpreter's
    interpreter = Interpreter(model_path=report.path)
    for key, detail in (
        ("input", interpreter.get_input_details()[0]),
        ("output", interpreter.get_output_details()[0]),
    ):
        scale, zero_point = detail["quantization"]
        assert meta[key]["dtype"] == np.dtype(detail["dtype"]).name == "uint8"
        assert meta[key]["scale"] == pytest.approx(scale, rel=1e-6)
        assert meta[key]["zero_point"] == zero_point
    # The pinned input range makes the uint8 input exactly the raw pixel value.
    assert meta["input"]["scale"] == pytest.approx(1 / 255, rel=1e-6)
    assert meta["input"]["zero_point"] == 0
    # inspect_tflite reads it back from the file alone
    assert inspect_tflite(report.path).metadata == meta


def test_float_model_metadata_has_no_quantization(converted):
    meta = converted("float32", "float32", 1).metadata
    assert meta["quantization"] == "float32" and meta["calibration"] is None
    assert meta["input"]["quantized"] is False and meta["input"]["dtype"] == "float32"


# --------------------------------------------------------------------------------------
# Errors (fast: raised before any tracing)


def _tiny() -> keras.Model:
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 1)(inputs)
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(x)))


def test_int8_without_representative_data_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="needs representative_data") as info:
        to_tflite(_tiny(), tmp_path / "x.tflite", quantization="int8")
    assert "dynamic_int8" in str(info.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"quantization": "int4"}, "quantization must be one of"),
        ({"quantization": "float16", "io_dtype": "int8"}, "io_dtype"),
        ({"quantization": "int8", "io_dtype": "int16",
          "representative_data": np.zeros((4, 8, 8, 3), np.float32)}, "io_dtype"),
        ({"representative_data": np.zeros((4, 8, 8, 3), np.float32)}, "only used by"),
        ({"class_names": ["a", "b"]}, "class_names has 2 entries"),
        ({"batch_size": "big"}, "batch_size"),
    ],
)
def test_invalid_options(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        to_tflite(_tiny(), tmp_path / "x.tflite", **kwargs)
    assert os.listdir(tmp_path) == []


def test_representative_data_is_checked(tmp_path):
    wrong_size = np.zeros((4, 16, 16, 3), np.float32)
    with pytest.raises(ValueError, match="size 16x16 but the model takes 8x8"):
        to_tflite(_tiny(), tmp_path / "x.tflite", quantization="int8",
                  representative_data=wrong_size)
    wrong_range = np.full((4, 8, 8, 3), 255.0, np.float32)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        to_tflite(_tiny(), tmp_path / "x.tflite", quantization="int8",
                  representative_data=wrong_range)
    with pytest.raises(ValueError, match=r"tf\.data\.Dataset"):
        to_tflite(_tiny(), tmp_path / "x.tflite", quantization="int8",
                  representative_data=[1, 2, 3])
    with pytest.raises(FileNotFoundError):
        to_tflite(_tiny(), tmp_path / "x.tflite", quantization="int8",
                  representative_data=str(tmp_path / "missing"))
    assert os.listdir(tmp_path) == []


def test_int16x8_zero_shift_is_refused_not_a_crash(tmp_path):
    # TF 2.21's int16x8 quantizer aborts the process on `0 - x` with a constant zero (a
    # GroupNorm1 at its initial beta = 0). to_tflite must raise instead.
    inputs = keras.Input((8, 8, 4))
    outputs = GroupNorm1(name="gn")(keras.layers.Conv2D(4, 1)(inputs))
    model = keras.Model(inputs, outputs)
    images = np.random.default_rng(0).random((16, 8, 8, 4), dtype=np.float32)
    with pytest.raises(UnsupportedOpError, match="all-zero constant") as info:
        to_tflite(model, tmp_path / "x.tflite", quantization="int16x8",
                  representative_data=images)
    assert info.value.layers == ["gn"]
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------
# Calibration sources


def test_calibration_sources(data, tmp_path):
    from PIL import Image

    gray = data["x_cal"][:40]
    # numpy uint8, gray (N, H, W): scaled to [0, 1] and repeated to RGB
    got = calibration_images(gray, image_size=(28, 28), num_samples=30, seed=1)
    assert got.shape == (30, 28, 28, 3) and got.dtype == np.float32
    assert 0.0 <= got.min() and got.max() <= 1.0
    assert np.allclose(got[..., 0], got[..., 2])
    expected_rows = np.sort(np.random.default_rng(1).choice(40, 30, replace=False))
    assert np.allclose(got[:, :, :, 0], gray[expected_rows] / 255.0)

    # tf.data: batched (images, labels), stops after num_samples
    rgb = _rgb(gray, 28)
    ds = tf.data.Dataset.from_tensor_slices((rgb, np.zeros(40, np.int64))).batch(16)
    got = calibration_images(ds, image_size=(28, 28), num_samples=20)
    assert got.shape == (20, 28, 28, 3) and np.allclose(got, rgb[:20])
    # unbatched dict elements
    ds = tf.data.Dataset.from_tensor_slices({"images": rgb})
    assert calibration_images(ds, image_size=(28, 28), num_samples=5).shape == (5, 28, 28, 3)

    # a folder of class sub-folders (PNG): resized to the model size, classes mixed
    for label in range(3):
        os.makedirs(tmp_path / f"class{label}")
        for i in range(5):
            Image.fromarray(gray[label * 5 + i]).save(tmp_path / f"class{label}" / f"{i}.png")
    got = calibration_images(str(tmp_path), image_size=(32, 32), num_samples=12, seed=0)
    assert got.shape == (12, 32, 32, 3) and 0.0 <= got.min() and got.max() <= 1.0

    # Fashion-MNIST by name (train split)
    got = calibration_images("fashion_mnist", image_size=(32, 32), num_samples=8)
    assert got.shape == (8, 32, 32, 3) and got.std() > 0.05
