"""`keras_mvit2.export.validate` and the `mvit2 export` / `mvit2 validate` commands.

A small CNN is trained on Fashion-MNIST (28x28, RGB by channel repeat, a few seconds), so
accuracy and agreement mean something; the report's fields are checked against numbers
computed here independently (a hand-written LiteRT loop with its own (de)quantization, the
interpreter's node list, `os.path.getsize`). The CLI is run end to end on that model.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter

from keras_mvit2.cli.main import main
from keras_mvit2.data.files import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_DIR,
    load_fashion_mnist_arrays,
)
from keras_mvit2.export import read_tflite_metadata, to_tflite
from keras_mvit2.export.calibration import load_labelled_images
from keras_mvit2.export.validate import (
    COREML_LINUX_NOTE,
    ValidationReport,
    print_reports,
    reference_outputs,
    save_reports,
    validate,
)

CLASSES = list(FASHION_MNIST_CLASSES)

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(FASHION_MNIST_DIR, "t10k-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)


def _rgb(images: np.ndarray) -> np.ndarray:
    return np.repeat(images[..., None].astype("float32") / 255.0, 3, axis=-1)


@pytest.fixture(scope="module")
def data():
    x_train, y_train = load_fashion_mnist_arrays("train")
    x_train, y_train = x_train[:6000], y_train[:6000].astype("int64")
    x_test, y_test = load_fashion_mnist_arrays("test")
    x_test, y_test = x_test[:400], y_test[:400].astype("int64")
    return _rgb(x_train), y_train, _rgb(x_test), y_test


def _tiny_cnn() -> keras.Model:
    inputs = keras.Input((28, 28, 3))
    h = inputs
    for filters in (16, 32):
        h = keras.layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False)(h)
        h = keras.layers.BatchNormalization(momentum=0.9)(h)
        h = keras.layers.ReLU()(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    outputs = keras.layers.Dense(10, name="logits")(h)
    return keras.Model(inputs, outputs, name="tiny_fashion_cnn")


@pytest.fixture(scope="module")
def untrained() -> keras.Model:
    """The tiny CNN as built: enough for the checks of bad input, which never run it."""
    keras.utils.set_random_seed(0)
    return _tiny_cnn()


@pytest.fixture(scope="module")
def model(data):
    x, y, _, _ = data
    keras.utils.set_random_seed(0)
    net = _tiny_cnn()
    net.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    net.fit(x, y, batch_size=64, epochs=2, verbose=0)
    return net


@pytest.fixture(scope="module")
def exports(model, data, tmp_path_factory):
    x, _, _, _ = data
    out = tmp_path_factory.mktemp("validate")
    return {
        "float32": to_tflite(model, out / "fp32.tflite", class_names=CLASSES),
        "int8": to_tflite(
            model, out / "int8.tflite", quantization="int8", io_dtype="int8",
            representative_data=x[-200:], class_names=CLASSES,
        ),
    }


def _run_independently(path: str, images: np.ndarray) -> np.ndarray:
    """Outputs of a batch-1 .tflite, with hand-written (de)quantization."""
    interpreter = Interpreter(model_path=path, num_threads=1)
    interpreter.allocate_tensors()
    inp = interpreter.get_input_details()[0]
    out = interpreter.get_output_details()[0]
    results = []
    for image in images:
        feed = image[None].astype("float32")
        if inp["dtype"] != np.float32:
            scale, zero = inp["quantization"]
            info = np.iinfo(inp["dtype"])
            feed = np.clip(np.round(feed / scale) + zero, info.min, info.max).astype(inp["dtype"])
        interpreter.set_tensor(inp["index"], feed)
        interpreter.invoke()
        y = interpreter.get_tensor(out["index"])[0]
        if out["dtype"] != np.float32:
            scale, zero = out["quantization"]
            y = (y.astype("float64") - zero) * scale
        results.append(np.asarray(y, "float64"))
    return np.stack(results)


def _ops_and_delegates(path: str) -> tuple[dict[str, int], int]:
    interpreter = Interpreter(model_path=path, num_threads=1)
    interpreter.allocate_tensors()
    ops = interpreter._get_ops_details()
    histogram: dict[str, int] = {}
    for op in ops:
        if op["op_name"] != "DELEGATE":
            histogram[op["op_name"]] = histogram.get(op["op_name"], 0) + 1
    return dict(sorted(histogram.items())), sum(op["op_name"] == "DELEGATE" for op in ops)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["float32", "int8"])
def test_report_matches_independent_numbers(model, data, exports, kind):
    _, _, x, y = data
    path = exports[kind].path
    report = validate(path, model, x, y, class_names=CLASSES)
    assert isinstance(report, ValidationReport)

    keras_out = np.asarray(model(x, training=False), "float64")
    exported = _run_independently(path, x)
    diff = np.abs(exported - keras_out)
    assert report.numeric and report.format == "tflite" and report.num_images == len(x)
    assert report.max_abs_diff == pytest.approx(diff.max(), rel=1e-5, abs=1e-6)
    assert report.mean_abs_diff == pytest.approx(diff.mean(), rel=1e-5, abs=1e-7)
    assert report.max_abs_reference == pytest.approx(np.abs(keras_out).max(), rel=1e-6)
    agreement = np.mean(exported.argmax(-1) == keras_out.argmax(-1))
    accuracy = np.mean(exported.argmax(-1) == y)
    keras_accuracy = np.mean(keras_out.argmax(-1) == y)
    assert report.top1_agreement == pytest.approx(agreement)
    assert report.accuracy == pytest.approx(accuracy)
    assert report.reference_accuracy == pytest.approx(keras_accuracy)
    assert report.accuracy_drop == pytest.approx(keras_accuracy - accuracy)
    assert keras_accuracy > 0.6, "the fixture model did not learn"
    # per class: Sneaker (7) as a sample
    mask = y == 7
    assert report.per_class_accuracy["Sneaker"] == (
        pytest.approx(np.mean(exported.argmax(-1)[mask] == 7)),
        pytest.approx(np.mean(keras_out.argmax(-1)[mask] == 7)),
    )
    assert report.size_bytes == os.path.getsize(path)
    assert report.reference_size_bytes == 4 * model.count_params()
    histogram, delegates = _ops_and_delegates(path)
    assert report.op_histogram == histogram
    assert report.num_ops == sum(histogram.values())
    assert report.num_xnnpack_partitions == delegates >= 1
    assert report.num_ops_in_xnnpack + report.num_ops_outside_xnnpack == report.num_ops
    assert report.quantization == kind
    if kind == "float32":
        assert report.max_abs_diff <= 1e-4 and report.top1_agreement == 1.0
        assert report.input_dtype == report.output_dtype == "float32"
    else:
        assert report.input_dtype == report.output_dtype == "int8"
        assert report.float_ops == {}
        assert report.top1_agreement >= 0.95 and report.accuracy_drop <= 0.03


@pytest.mark.slow
def test_float_ops_left_are_reported(model, data, tmp_path):
    x, _, xt, yt = data
    inputs = keras.Input((28, 28, 3))
    squared = keras.layers.Lambda(lambda t: tf.math.square(t), name="square")(model(inputs))
    mixed = keras.Model(inputs, squared, name="mixed")
    path = tmp_path / "mixed.tflite"
    to_tflite(mixed, path, quantization="int8", representative_data=x[:100], allow_float_ops=True)
    report = validate(path, mixed, xt[:50], yt[:50])
    assert report.float_ops.get("SQUARE") == 1
    assert any("Float ops left" in note and "SQUARE" in note for note in report.notes)


def test_bad_inputs(untrained, data, tmp_path):
    _, _, x, y = data
    path = to_tflite(untrained, tmp_path / "fp32.tflite").path
    with pytest.raises(ValueError, match="labels"):
        validate(path, untrained, x, y[:10])
    with pytest.raises(ValueError, match="resize"):
        validate(path, untrained, x[:, :20, :20], y)
    with pytest.raises(FileNotFoundError):
        validate(tmp_path / "missing.tflite", untrained, x, y)


@pytest.mark.slow
def test_save_and_print(model, data, exports, tmp_path):
    _, _, x, y = data
    outputs = reference_outputs(model, x)
    reports = [
        validate(exports[k].path, model, x, y, reference_outputs=outputs)
        for k in ("float32", "int8")
    ]
    target = tmp_path / "reports.json"
    save_reports(reports, target)
    saved = json.loads(target.read_text())["reports"]
    assert [r["exported_path"] for r in saved] == [r.exported_path for r in reports]
    assert saved[1]["top1_agreement"] == reports[1].top1_agreement
    assert saved[1]["per_class_accuracy"]["Bag"]["keras"] == reports[1].per_class_accuracy[
        "Bag"][1]
    assert sorted(os.listdir(tmp_path)) == ["reports.json"]

    from rich.console import Console

    console = Console(record=True, width=200)
    print_reports(reports, console=console)
    text = console.export_text()
    assert "top-1 agreement" in text and "XNNPACK partitions" in text
    assert f"{100 * reports[1].top1_agreement:.2f} %" in text


@pytest.mark.slow
@pytest.mark.skipif(
    __import__("importlib").util.find_spec("coremltools") is None,
    reason="coremltools not installed",
)
def test_coreml_is_structural_off_macos(model, data, tmp_path):
    import platform

    from keras_mvit2.export import to_coreml

    _, _, x, y = data
    path = tmp_path / "tiny.mlpackage"
    to_coreml(model, path, class_names=CLASSES)
    report = validate(path, model, x[:20], y[:20])
    assert report.format == "coreml" and report.op_histogram
    if platform.system() != "Darwin":
        assert not report.numeric and report.max_abs_diff is None
        assert COREML_LINUX_NOTE in report.notes


# --------------------------------------------------------------------------------------
# CLI


@pytest.mark.slow
def test_cli_export_then_validate(model, data, tmp_path, capsys):
    from PIL import Image

    _, _, xt, yt = data
    model_path = tmp_path / "tiny.keras"
    model.save(model_path)
    names = tmp_path / "classes.txt"
    names.write_text("\n".join(CLASSES) + "\n")
    int8_path = tmp_path / "tiny_int8.tflite"
    rc = main([
        "export", str(model_path), "--format", "tflite", "--quantization", "int8",
        "--calibration-data", "fashion_mnist", "--num-calibration-samples", "100",
        "--io-dtype", "uint8", "--class-names", str(names), "-o", str(int8_path),
        "--sidecar", "--json", str(tmp_path / "export.json"),
    ])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "XNNPACK partitions" in printed and "float ops left" in printed
    assert "fused 1x1 conv pairs" in printed
    meta = read_tflite_metadata(int8_path)
    assert meta["quantization"] == "int8" and meta["class_names"] == CLASSES
    assert meta["calibration"] == {"source": "fashion_mnist", "num_samples": 100,
                                   "activation_ranges": "p99.99"}
    assert json.loads((tmp_path / "tiny_int8.tflite.json").read_text()) == meta
    exported = json.loads((tmp_path / "export.json").read_text())
    assert exported["float_ops"] == {} and exported["inputs"][0]["dtype"] == "uint8"

    fp32_path = tmp_path / "tiny_fp32.tflite"
    assert main(["export", str(model_path), "-o", str(fp32_path)]) == 0  # format from suffix
    unfused_path = tmp_path / "tiny_fp32_unfused.tflite"
    assert main(["export", str(model_path), "-o", str(unfused_path), "--no-fuse-pointwise"]) == 0
    capsys.readouterr()
    # fusion on by default (this CNN has no 1x1 pair to fuse), off with the flag
    fused = read_tflite_metadata(fp32_path)["graph_optimizations"]
    assert fused == {"fused_pointwise_convolutions": 0, "macs_saved": 0}
    assert read_tflite_metadata(unfused_path)["graph_optimizations"] is None

    report_path = tmp_path / "validation.json"
    rc = main([
        "validate", str(int8_path), str(fp32_path), "--reference", str(model_path),
        "--data", "fashion_mnist", "--limit", "300", "--json", str(report_path),
    ])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "top-1 agreement" in printed and "tiny_int8.tflite" in printed
    saved = json.loads(report_path.read_text())["reports"]
    assert [os.path.basename(r["exported_path"]) for r in saved] == [
        "tiny_int8.tflite", "tiny_fp32.tflite"]
    # Same numbers as the API on the same images (the first 300 test images).
    images = load_labelled_images("fashion_mnist", image_size=(28, 28), limit=300)
    assert np.array_equal(images.labels, yt[:300])
    assert np.allclose(images.images, xt[:300], atol=1e-6)
    expected = validate(int8_path, model, images.images, images.labels)
    assert saved[0]["num_images"] == 300
    assert saved[0]["top1_agreement"] == expected.top1_agreement
    assert saved[0]["accuracy"] == expected.accuracy
    assert saved[0]["max_abs_diff"] == pytest.approx(expected.max_abs_diff)
    assert saved[1]["max_abs_diff"] <= 1e-4

    # A folder of images (one sub-folder per class) works as --data too: 4 per class.
    folder = tmp_path / "images"
    picked = np.concatenate([np.flatnonzero(yt == label)[:4] for label in range(10)])
    for i in picked:
        os.makedirs(folder / f"{yt[i]:02d}", exist_ok=True)
        Image.fromarray((xt[i, ..., 0] * 255).round().astype("uint8")).save(
            folder / f"{yt[i]:02d}" / f"{i}.png")
    folder_json = tmp_path / "folder.json"
    rc = main(["validate", str(fp32_path), "--reference", str(model_path),
               "--data", str(folder), "--crop-ratio", "1.0", "--json", str(folder_json)])
    assert rc == 0
    folder_report = json.loads(folder_json.read_text())["reports"][0]
    assert folder_report["num_images"] == 40
    keras_top1 = np.asarray(model(xt[picked], training=False)).argmax(-1)
    assert folder_report["reference_accuracy"] == pytest.approx(np.mean(keras_top1 == yt[picked]))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export", "{model}", "--quantization", "int8", "-o", "{out}"],
         "needs --calibration-data"),
        (["export", "no_such_model", "-o", "{out}"], "Unknown model"),
        (["export", "{model}", "--quantization", "float16", "--io-dtype", "int8", "-o", "{out}"],
         "io_dtype"),
        (["export", "{model}", "-o", "{tmp}/x.onnx"], "Cannot tell the format"),
        (["validate", "{tmp}/missing.tflite", "--reference", "{model}", "--data",
          "fashion_mnist"], "not found"),
    ],
)
def test_cli_errors(untrained, tmp_path, capsys, argv, message):
    model_path = tmp_path / "tiny.keras"
    untrained.save(model_path)
    out = tmp_path / "out.tflite"
    args = [a.format(model=model_path, out=out, tmp=tmp_path) for a in argv]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
