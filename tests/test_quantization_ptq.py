"""Post-training quantization of MobileViTV2-0.5 to TFLite, checked in LiteRT on real images.

The run's trained classifier (tests/shared_fixtures.py, built once per pytest run and
shared with the other modules that need a trained model) is MobileViTV2-0.5 fitted on
Fashion-MNIST at 32x32 (RGB by channel repeat, 160 steps of 64 images: 80-82 % test
accuracy): int8 checks on random weights prove nothing (the activations vanish and int8
outputs go constant). Every quantization mode converts that model and runs in
``ai_edge_litert`` on 1,000 held-out test images (the full-int8 models on all 10,000: on
1,000 the standard error of an accuracy drop is about 0.5 points, which made a 1-point
bound flaky). The full-int8 model is also converted at the real 256x256 size, after
fine-tuning there (see `test_int8_real_size_256`).

Thresholds (measured on this recipe, with margin): int8 top-1 agreement with Keras
>= 0.96 (measured 0.972-0.983) and test-accuracy drop <= 1.0 point (measured -0.3 to
+0.2 on 10,000 images); dynamic-range int8 agreement >= 0.98 (measured
0.991-0.994); float16 >= 0.995 (measured 1.0); float32 max |diff| <= 1e-4; int16x8 agreement >= 0.98
(measured 0.99; the attention's normaliser is N * mean because LiteRT 2.3's int16 SUM
kernel is wrong) and closer to Keras than int8.
"""

import json
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from model_utils import float_ops_from_interpreter
from shared_fixtures import (
    CLASSIFIER_BATCH,
    CLASSIFIER_SIZE,
    CLASSIFIER_STEPS,
    fashion_mnist_rgb,
)

import keras_mvit2 as mv
from keras_mvit2.data.sources import (
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
FINE_TUNE_STEPS = 64  # at 256x256 (test_int8_real_size_256)
FINE_TUNE_BATCH = 8

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
        "x_fine_tune": x_train[n : n + FINE_TUNE_STEPS * FINE_TUNE_BATCH],
        "y_fine_tune": y_train[n : n + FINE_TUNE_STEPS * FINE_TUNE_BATCH],
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


@pytest.mark.parametrize(
    "quantization, io_dtype, batch_size, min_agreement",
    FORMATS,
    ids=[f"{q}-{io}-{'dyn' if b is None else b}" for q, io, b, _ in FORMATS],
)
def test_format_converts_and_runs_on_real_images(
    converted, test_set, quantization, io_dtype, batch_size, min_agreement, record_property
):
    report = converted(quantization, io_dtype, batch_size)
    _assert_builtin_only(report)
    assert report.inputs[0].dtype == io_dtype and report.outputs[0].dtype == io_dtype
    assert report.inputs[0].shape_signature == ((-1 if batch_size is None else 1), SIZE, SIZE, 3)
    assert report.dynamic_batch == (batch_size is None)
    assert report.quantization == quantization
    if io_dtype != "float32":
        assert report.inputs[0].quantization[0] > 0 and report.outputs[0].quantization[0] > 0

    n = len(test_set["y"]) if quantization == "int8" else NUM_TEST
    got = run_tflite(report.path, test_set["x"][:n])
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


def _fidelity(got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """How closely int8 logits `got` follow the Keras logits `ref`, (images, classes) each.

    corr: correlation of the per-image centered logit vectors (0 for constant logits);
    relative_error: mean |got - ref| of the raw logits over the std of the centered
    Keras logits (an offset counts); agreement: top-1 agreement.
    """
    a = got - got.mean(-1, keepdims=True)
    b = ref - ref.mean(-1, keepdims=True)
    norm = float(np.sqrt(np.sum(a * a) * np.sum(b * b)))
    return {
        "corr": float(np.sum(a * b)) / norm if norm > 0 else 0.0,
        "relative_error": float(np.abs(got - ref).mean() / b.std()),
        "agreement": float(np.mean(got.argmax(-1) == ref.argmax(-1))),
    }


def _int8_256_failures(full: dict, attention_float: dict) -> list[str]:
    """The bars of the full-int8 model at 256x256 (see `test_int8_real_size_256`).

    `full` and `attention_float` are `_fidelity` of the full-int8 model and of the same
    conversion with the attention's ops in float. Measured over 7 trainings (this
    recipe and two nearby ones): full corr 0.68-0.99, relative error 0.17-0.54, agreement
    0.42-0.84; full minus attention-in-float: corr -0.06 to +0.03, relative error -0.08
    to +0.08. The code before this test's redesign: corr -0.17 below.
    """
    failures = []
    if full["corr"] < 0.5:
        failures.append(f"logit correlation {full['corr']:.3f} < 0.5")
    if full["relative_error"] > 0.75:
        failures.append(f"relative logit error {full['relative_error']:.3f} > 0.75")
    if full["agreement"] < 0.3:
        failures.append(f"top-1 agreement {full['agreement']:.3f} < 0.3")
    if full["corr"] < attention_float["corr"] - 0.1:
        failures.append(
            f"correlation {full['corr']:.3f} is more than 0.1 below the same model with its "
            f"attention in float ({attention_float['corr']:.3f})"
        )
    if full["relative_error"] > attention_float["relative_error"] + 0.15:
        failures.append(
            f"relative error {full['relative_error']:.3f} is more than 0.15 above the same "
            f"model with its attention in float ({attention_float['relative_error']:.3f})"
        )
    return failures


@pytest.fixture(scope="module")
def fine_tuned_256(trained, data):
    """The fixture model at 256x256, fine-tuned there for 64 steps of 8 images.

    The 32x32 weights alone are at chance at 256 (top-1 8-13 %, near-tied logits: whether
    int8 keeps their top-1 is luck). Fine-tuned, their 256x256 logits mean something:
    top-1 0.39-0.68 on the 96 test images below (chance 0.1; 8 trainings).
    """
    model = mv.MobileViTV2(0.5, input_shape=(256, 256, 3), classes=10, classifier_activation=None)
    model.set_weights(trained.get_weights())  # no size-dependent weights in MobileViTv2
    optimizer = keras.optimizers.Adam(
        keras.optimizers.schedules.CosineDecay(2e-3, FINE_TUNE_STEPS, alpha=0.05)
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    optimizer.build(model.trainable_variables)
    # Seeded: the batches' shuffle order would otherwise follow whatever the modules run
    # before this one in the same worker left in the global random state.
    keras.utils.set_random_seed(0)
    model.fit(
        _rgb(data["x_fine_tune"], 256), data["y_fine_tune"],
        batch_size=FINE_TUNE_BATCH, epochs=1, verbose=0,
    )
    return model


def _with_attention_in_float(model, calibration, tensor_names) -> bytes:
    """The same full-int8 conversion with the attention layers' ops left in float."""
    from keras_mvit2.export.tflite.convert import _concrete_function, _make_converter

    function = _concrete_function(model, (1, *model.input_shape[1:]))
    denylisted = [n for n in tensor_names if re.search(r"/attn(_\d+)?/", n)]
    assert len(denylisted) > 9 * 8, "attention ops not found by name"
    debugger = tf.lite.experimental.QuantizationDebugger(
        converter=_make_converter(function, "int8", "float32", calibration),
        debug_dataset=lambda: ([calibration[i : i + 1]] for i in range(1)),
        debug_options=tf.lite.experimental.QuantizationDebugOptions(
            denylisted_nodes=denylisted
        ),
    )
    return debugger.get_nondebug_quantized_model()


def test_int8_real_size_256(fine_tuned_256, data, out_dir, tmp_path, record_property):
    """Full int8 at 256x256 (the deployment size: 256 tokens per attention), on a model
    whose 256x256 outputs mean something.

    How close int8 comes to float depends on the model as much as on the export: with
    every attention op kept in float, this briefly fine-tuned model's int8 convolutions
    alone leave a logit correlation between 0.74 and 0.99 depending on the training (its
    activations have outliers). So the int8 model is held to two kinds of bar: absolute
    ones that only a broken model fails (constant, offset, shuffled or noisy logits:
    checked below against the same bars), and bars relative to the same conversion with
    the attention in float, which keep the attention's own int8 error at 256 tokens small.
    (Before the attention summed the tokens in int32, its per-token scores of about 1/256
    were rounded to 8 bits: correlation 0.82 against 0.99 with the attention in float.)
    """
    model = fine_tuned_256
    calib = _rgb(data["x_cal"][:64], 256)
    report = to_tflite(
        model, out_dir / "fm_int8_256.tflite", quantization="int8", io_dtype="int8",
        representative_data=calib,
    )
    _assert_builtin_only(report)
    assert report.inputs[0].shape == (1, 256, 256, 3) and report.inputs[0].dtype == "int8"
    # Input range pinned to [0, 1]: raw pixels minus 128 are the int8 input.
    assert report.inputs[0].quantization == (pytest.approx(1 / 255), -128)
    assert report.float_ops == {} and float_ops_from_interpreter(report.path) == {}
    assert report.max_tensor_rank <= 4
    record_property("op_histogram_256_int8", json.dumps(report.op_histogram))
    record_property("xnnpack_partitions_256_int8", report.num_xnnpack_partitions)
    record_property("ops_outside_xnnpack_256_int8", json.dumps(report.ops_outside_xnnpack))

    x, y = _rgb(data["x_test"][:96], 256), data["y_test"][:96]
    ref = np.asarray(model.predict(x, batch_size=16, verbose=0), dtype="float32")
    accuracy = float(np.mean(ref.argmax(-1) == y))
    assert accuracy >= 0.25, f"the fine-tuned model is near chance at 256 ({accuracy:.3f})"

    full = _fidelity(run_tflite(report.path, x), ref)
    names = [t["name"] for t in Interpreter(model_path=str(report.path)).get_tensor_details()]
    reference_path = tmp_path / "attention_float.tflite"
    reference_path.write_bytes(_with_attention_in_float(model, calib, names))
    attention_float = _fidelity(run_tflite(reference_path, x), ref)
    for key, value in full.items():
        record_property(f"{key}_256", value)
        record_property(f"{key}_256_attention_float", attention_float[key])
    print(f"\nint8 at 256x256: Keras top-1 {accuracy:.3f}; full int8 {full}; "
          f"attention in float {attention_float}")
    assert _int8_256_failures(full, attention_float) == [], (full, attention_float)

    # The bars reject broken int8 output of this very model.
    rng = np.random.default_rng(0)
    spread = float((ref - ref.mean(-1, keepdims=True)).std())
    broken = {
        "constant": np.broadcast_to(ref.mean(0), ref.shape),
        "offset": ref + 2.0 * spread,
        "shuffled classes": np.roll(ref, 3, axis=-1),
        "noisy": ref + rng.normal(0.0, spread, ref.shape),
    }
    for name, logits in broken.items():
        assert _int8_256_failures(_fidelity(logits, ref), attention_float), name


def test_int16x8_is_closer_to_keras_than_int8(converted, test_set):
    ref, x = test_set["logits"][:NUM_TEST], test_set["x"][:NUM_TEST]
    int16 = run_tflite(converted("int16x8", "float32", 1).path, x)
    int8 = run_tflite(converted("int8", "float32", 1).path, x)
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
