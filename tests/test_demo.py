"""`mvit2 demo` / `keras_mvit2.demo.run_demo`, run once with the small settings.

Every artefact is checked with an oracle that does not go through the code that wrote it:
the accuracies are recomputed from the saved `.keras` model and from the `.tflite` file in
a fresh LiteRT interpreter on the test images read straight from the IDX files; the int8
claim is checked op by op on the interpreter's tensor types; the PNG is decoded with PIL;
the Core ML package is read back with coremltools.
"""

import importlib.util
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from ai_edge_litert.interpreter import Interpreter
from model_utils import float_ops_from_interpreter

from keras_mvit2.data.files import FASHION_MNIST_DIR, load_fashion_mnist_arrays
from keras_mvit2.demo import SMALL, DemoSettings, print_summary, run_demo
from keras_mvit2.export import read_tflite_metadata

HAS_COREML = importlib.util.find_spec("coremltools") is not None

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not os.path.exists(os.path.join(FASHION_MNIST_DIR, "t10k-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return run_demo(tmp_path_factory.mktemp("demo") / "out", small=True, verbose=0)


@pytest.fixture(scope="module")
def test_images(demo):
    """The first test images at the demo size: the evaluation transform with crop ratio 1
    (bilinear antialiased resize of the whole 28x28 image, scaled to [0, 1], gray -> RGB),
    in the same float operations and order, so the images are bit-identical (the int8
    model rounds its input to 1/255 steps: one ulp can flip a prediction)."""
    n, size = demo.num_test_images, demo.settings.image_size
    x, y = load_fashion_mnist_arrays("test")
    x, y = x[:n], y[:n].astype("int64")
    pixels = tf.image.resize(x[..., None].astype("float32"), (size, size), "bilinear",
                             antialias=True)
    images = np.clip(np.asarray(pixels) * np.float32(1.0 / 255.0), 0.0, 1.0)
    return np.repeat(images, 3, axis=-1).astype("float32"), y


@pytest.fixture(scope="module")
def saved_model_top1(demo, test_images):
    """The saved `.keras` model, loaded here, and its top-1 on `test_images`."""
    model = keras.saving.load_model(demo.paths["model"], compile=False)
    x, _ = test_images
    return model, np.asarray(model.predict(x, batch_size=250, verbose=0)).argmax(-1)


def test_summary_json_holds_the_result(demo):
    with open(demo.paths["summary"]) as f:
        summary = json.load(f)
    assert summary == json.loads(json.dumps(demo.to_dict()))
    assert summary["settings"]["image_size"] == SMALL.image_size
    assert [s["name"] for s in summary["steps"]] == [
        "train", "evaluate", "export TFLite int8", "export Core ML", "validate", "benchmark",
        "visualize",
    ]
    for name, path in demo.paths.items():
        if name != "coreml" or HAS_COREML:
            assert path is not None and os.path.exists(path), (name, path)


def test_accuracy_equals_a_recomputation_from_the_saved_model(demo, test_images,
                                                            saved_model_top1):
    _, y = test_images
    model, predicted = saved_model_top1
    assert model.input_shape[1:] == (SMALL.image_size, SMALL.image_size, 3)
    assert demo.num_test_images == len(y) == SMALL.test_images
    assert demo.accuracy == float(np.mean(predicted == y))
    with open(demo.paths["metrics"]) as f:
        assert json.load(f)["metrics"]["raw"]["top1"] == demo.accuracy
    # Chance is 10 %; the small run reaches about 78 %.
    assert demo.accuracy >= 0.6, demo.accuracy
    assert demo.top5 >= demo.accuracy


def test_tflite_is_full_int8_and_its_figures_are_right(demo, test_images, saved_model_top1):
    path = demo.paths["tflite"]
    assert float_ops_from_interpreter(path) == {} and demo.int8_float_ops == {}
    interpreter = Interpreter(model_path=path)
    interpreter.allocate_tensors()
    ops = interpreter._get_ops_details()
    dtypes = {t["index"]: np.dtype(t["dtype"]) for t in interpreter.get_tensor_details()}
    convs = [op for op in ops if op["op_name"] in ("CONV_2D", "DEPTHWISE_CONV_2D")]
    names = {op["op_name"] for op in ops}
    if "DELEGATE" not in names:  # without XNNPACK every conv is listed: int8 weights
        assert convs and all(dtypes[op["inputs"][1]] == np.int8 for op in convs)
    (inp,), (out,) = interpreter.get_input_details(), interpreter.get_output_details()
    assert inp["shape"].tolist() == [1, SMALL.image_size, SMALL.image_size, 3]
    assert out["shape"].tolist() == [1, 10]

    x, y = test_images
    _, keras_top1 = saved_model_top1
    int8_top1 = []
    for image in x:
        interpreter.set_tensor(inp["index"], image[None])
        interpreter.invoke()
        int8_top1.append(int(interpreter.get_tensor(out["index"])[0].argmax()))
    int8_top1 = np.asarray(int8_top1)
    assert demo.int8_accuracy == float(np.mean(int8_top1 == y))
    assert demo.int8_agreement == float(np.mean(int8_top1 == keras_top1))
    assert demo.int8_agreement >= 0.9, demo.int8_agreement
    assert demo.int8_size_bytes == os.path.getsize(path)
    # Client-ready: the standard metadata MediaPipe Tasks reads, with the class names.
    standard = read_tflite_metadata(path)["tflite_metadata"]
    labels = standard["associatedFileContents"]["labels.txt"].splitlines()
    assert labels == list(demo.class_names) and len(labels) == 10


def test_validation_report_covers_both_exports(demo):
    with open(demo.paths["validation"]) as f:
        reports = json.load(f)["reports"]
    assert [r["format"] for r in reports] == (["tflite", "coreml"] if HAS_COREML else ["tflite"])
    tflite = reports[0]
    assert tflite["quantization"] == "int8" and tflite["numeric"] is True
    assert tflite["accuracy"] == demo.int8_accuracy
    assert tflite["reference_accuracy"] == demo.accuracy  # same images as the evaluation
    assert tflite["num_images"] == demo.num_test_images
    if HAS_COREML:
        assert reports[1]["exported_path"] == demo.paths["coreml"]


@pytest.mark.skipif(not HAS_COREML, reason="needs the coreml extra")
def test_coreml_package_is_an_image_classifier(demo):
    import coremltools as ct

    spec = ct.models.MLModel(demo.paths["coreml"], skip_model_load=True).get_spec()
    assert spec.WhichOneof("Type") == "mlProgram"
    image = spec.description.input[0].type.imageType
    assert (image.width, image.height) == (SMALL.image_size, SMALL.image_size)
    outputs = {o.name for o in spec.description.output}
    assert "classLabel" in outputs
    # One op count for every report: compute ops, constants not counted (as in TFLite).
    ops = sum(op.type != "const" for function in spec.mlProgram.functions.values()
              for block in function.block_specializations.values() for op in block.operations)
    assert ops == demo.coreml_ops > 0


def test_benchmark_record(demo):
    from keras_mvit2.latency import load_results

    (record,) = load_results(demo.paths["bench"])
    assert record.latency_ms.median == demo.latency_ms > 0
    assert record.latency_ms.runs == SMALL.bench_runs
    assert record.model["path"] == demo.paths["tflite"]
    assert record.runtime["threads"] == 1


def test_context_score_png(demo):
    from PIL import Image

    with Image.open(demo.paths["context_scores"]) as image:
        image.verify()
    with Image.open(demo.paths["context_scores"]) as image:
        assert image.format == "PNG" and min(image.size) > 100
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.std() > 10  # drawn, not blank
    assert demo.num_context_maps == 9  # 2 + 4 + 3 transformer layers of MobileViTV2


def test_summary_table_names_every_step_and_file(demo):
    from rich.console import Console

    console = Console(record=True, width=200)
    print_summary(demo, console)
    text = console.export_text()
    for row in demo.steps:
        assert row.name in text
        if row.artefact is not None:
            assert os.path.relpath(row.artefact, demo.output_dir) in text
    assert f"top-1 {100 * demo.accuracy:.1f} %" in text


def test_cli_registers_demo():
    from keras_mvit2.cli.demo_cmd import _demo
    from keras_mvit2.cli.main import build_parser

    args = build_parser().parse_args(["demo", "--small", "-o", "somewhere", "--threads", "2"])
    assert args.handler is _demo and args.small and args.output == "somewhere"
    assert args.threads == 2


def test_bad_settings_fail_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="image_size must be >= 32"):
        DemoSettings(image_size=16)
    with pytest.raises(ValueError, match="train_steps must be a positive int"):
        DemoSettings(train_steps=0)
    with pytest.raises(ValueError, match="threads must be a positive int"):
        run_demo(tmp_path / "x", threads=0)
    assert not (tmp_path / "x").exists()
