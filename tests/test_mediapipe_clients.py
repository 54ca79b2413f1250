"""Exports loaded as they are by MediaPipe Tasks (the same C++ task code as the Android /
iOS / web libraries), on a briefly trained Fashion-MNIST model.

The oracle is the Keras model on the same 200 test images: MediaPipe gets them as uint8 RGB
(as a camera frame) and must find the standard TFLite Model Metadata (normalization, labels)
to classify / segment / detect them at all. mediapipe runs in a virtualenv of its own (made
by ``.ci/run``: installed beside TensorFlow it would upgrade absl-py and add OpenCV), through
tests/mediapipe_client.py in a subprocess.

The classifier's weights at 64x64 also go by the PyTorch road (`keras_mvit2.export.roads`:
litert-torch in one ``KERAS_BACKEND=torch`` worker, tests/backend_worker.py, ~25 s for the
`.tflite`, ~12 s for the Core ML package, ~7 s for the Core AI asset on 2 busy cores): the
float32 file must give the Keras model's outputs and the TensorFlow road's file's (<= 1e-5 of
the largest), carry the same metadata, labels and signature, and classify in MediaPipe with
its names. The same worker writes the PyTorch road's float32 Core ML package
(``torch.export`` + coremltools), whose MIL program must give the Keras model's outputs and
which must describe itself as the TensorFlow road's package does, and a Core AI asset
(coreai-torch; read here, run on macOS only).
"""

import importlib.util
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from shared_fixtures import (
    CHECKPOINTS,
    CLASSIFIER_BATCH,
    CLASSIFIER_SIZE,
    CLASSIFIER_STEPS,
    DETECTOR_SCORE_THRESHOLD,
    DETECTOR_SIZE,
    client_classifier,
    client_pixels,
    client_rgb_uint8,
)

from keras_mvit2.data.files import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_DIR,
    load_fashion_mnist_arrays,
)
from keras_mvit2.export import inspect_tflite, read_tflite_metadata, run_tflite, to_tflite

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SIZE = CLASSIFIER_SIZE
#: Test images for the segmenter and the detector (the issue's 200).
NUM_TEST = 200
#: The classifier's agreement is measured on more: its int8 export agrees with Keras on
#: 0.967-0.974 of 2,000 test images (three trainings of the fixture's recipe), so on 200 the
#: sampling error alone (+-0.012) put the 0.95 bar within two standard deviations.
NUM_TEST_CLASSIFIER = 1000
#: The images the run's trained classifier was fitted on (tests/shared_fixtures.py).
TRAIN_STEPS, BATCH = CLASSIFIER_STEPS, CLASSIFIER_BATCH


def _mediapipe_python() -> str | None:
    python = os.environ.get("MVIT2_MEDIAPIPE_PYTHON") or os.path.join(
        ROOT, ".venv-mediapipe", "bin", "python"
    )
    return python if os.path.exists(python) else None


MEDIAPIPE_PYTHON = _mediapipe_python()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(os.path.join(FASHION_MNIST_DIR, "t10k-images-idx3-ubyte.gz")),
        reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
    ),
    pytest.mark.skipif(
        MEDIAPIPE_PYTHON is None,
        reason="no MediaPipe virtualenv: .ci/run makes .venv-mediapipe (python3 -m venv "
        ".venv-mediapipe && .venv-mediapipe/bin/pip install mediapipe==1.2.3), or set "
        "MVIT2_MEDIAPIPE_PYTHON",
    ),
]


@pytest.fixture(scope="module")
def data():
    x, y = load_fashion_mnist_arrays("train")
    xs, ys = load_fashion_mnist_arrays("test")
    n = TRAIN_STEPS * BATCH
    return (client_rgb_uint8(x[:n], SIZE), y[:n].astype("int64"),
            client_rgb_uint8(xs[:NUM_TEST_CLASSIFIER], SIZE), ys[:NUM_TEST_CLASSIFIER])


@pytest.fixture(scope="module")
def classifier(trained_classifier_path):
    """MobileViTV2-0.5 at 32x32 with a softmax: the weights of the run's trained classifier
    (conftest.py: fitted on the first 160 x 64 training images, 80-82 % test accuracy)."""
    return client_classifier(trained_classifier_path)


#: Images the two roads' float32 files and Keras are compared on (and MediaPipe classifies).
NUM_ROADS = 100
#: The PyTorch road's input size: the classifier's weights at 64x64 (litert-torch 0.10 fails
#: to lower this classifier at 32x32: "'func.call' op operand type mismatch", i64 vs i32).
ROADS_SIZE = 64
#: max |difference| / max |Keras output| allowed for a float32 file.
ROADS_REL_TOL = 1e-5


@pytest.fixture(scope="module")
def roads(classifier, data, tmp_path_factory):
    """The classifier's float32 `.tflite` by both roads, with Fashion-MNIST's names: the
    TensorFlow road here, the PyTorch road in one worker; None without litert-torch."""
    if importlib.util.find_spec("litert_torch") is None or importlib.util.find_spec(
            "torch") is None:
        return None
    from test_backends import run_worker

    import keras_mvit2 as mv

    folder = tmp_path_factory.mktemp("roads")
    names = list(FASHION_MNIST_CLASSES)
    model = mv.mobilevitv2_050(input_shape=(ROADS_SIZE, ROADS_SIZE, 3), classes=10,
                               weights=None)
    model.set_weights(classifier.get_weights())
    factor = ROADS_SIZE // SIZE  # test images, each pixel repeated: uint8 as a camera gives
    pixels = np.repeat(np.repeat(data[2][:NUM_ROADS], factor, 1), factor, 2)
    x = (pixels / 255.0).astype("float32")
    np.savez(folder / "x.npz", x=x)
    model.save_weights(folder / "classifier.weights.h5")
    torch_path = folder / "torch_road.tflite"
    coreml_path = folder / "torch_road.mlpackage"
    job = {"width": 0.5, "size": ROADS_SIZE, "classes": 10,
           "weights": str(folder / "classifier.weights.h5"), "class_names": names,
           "npz": str(folder / "x.npz"), "out": str(torch_path)}
    if importlib.util.find_spec("ai_edge_quantizer") is not None:  # `mvit2 export --road
        job.update(out_int8=str(folder / "torch_road_int8.tflite"),  # torch` int8's reader
                   calibration_data="fashion_mnist")
    if importlib.util.find_spec("coremltools") is not None:
        job["out_coreml"] = str(coreml_path)
    if importlib.util.find_spec("coreai_torch") is not None:
        job["out_coreai"] = str(folder / "torch_road.aimodel")
    result = run_worker("torch", {"torch_road": job}, folder)
    tf_path = folder / "tensorflow_road.tflite"
    to_tflite(model, tf_path, class_names=names)
    with np.load(str(torch_path) + ".npz") as out:
        keras_torch = out["y"]
    return {"torch": torch_path, "tensorflow": tf_path, "x": x, "pixels": pixels,
            "model": model, "worker": result, "keras_torch": keras_torch, "names": names,
            "coreml": coreml_path if "out_coreml" in job else None,
            "int8": job.get("out_int8"),
            "coreai": job.get("out_coreai")}


def _run_mediapipe(tmp_path, images: np.ndarray, models: list[dict]) -> dict[str, np.ndarray]:
    np.save(tmp_path / "images.npy", images)
    request = {"images": str(tmp_path / "images.npy"), "out": str(tmp_path / "out.npz"),
               "models": models}
    with open(tmp_path / "request.json", "w") as f:
        json.dump(request, f)
    done = subprocess.run([MEDIAPIPE_PYTHON, os.path.join(HERE, "mediapipe_client.py"),
                           str(tmp_path / "request.json")], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as out:
        return dict(out)


CLASSIFIER_FORMATS = {  # key: (quantization, io_dtype, minimum top-1 agreement with Keras)
    "float32": ("float32", "float32", 0.99),
    "float16": ("float16", "float32", 0.99),
    "int8": ("int8", "float32", 0.95),
    "int8_uint8_io": ("int8", "uint8", 0.95),
}


@pytest.fixture(scope="module")
def classifier_files(client_classifier_tflite, classifier, data, tmp_path_factory):
    """{key: `.tflite`} of `CLASSIFIER_FORMATS`, all with Fashion-MNIST's names, int8
    calibrated on the first 200 training images: float32 and int8 with float I/O are the
    run's (conftest.py's `client_classifier_tflite`, which tests/test_web.py loads too),
    float16 and int8 with uint8 I/O are made here from the same weights."""
    folder = tmp_path_factory.mktemp("classifier_files")
    files = {}
    for key, (quantization, io_dtype, _) in CLASSIFIER_FORMATS.items():
        if io_dtype == "float32" and quantization in client_classifier_tflite:
            files[key] = client_classifier_tflite[quantization]
            continue
        files[key] = folder / f"classifier_{key}.tflite"
        to_tflite(classifier, files[key], quantization=quantization, io_dtype=io_dtype,
                  class_names=list(FASHION_MNIST_CLASSES),
                  representative_data=data[0][:200] if quantization == "int8" else None)
    return files


#: ai-edge-quantizer recipes of the float32 file (key: (recipe, minimum top-1 agreement)).
EDGE_FORMATS = {"edge_weight_only_wi4_wi8": ("weight_only_wi4_wi8", 0.85),
                "edge_static_wi8_ai8": ("static_wi8_ai8", 0.55)}  # measured 0.949, 0.681


def _edge_quantized(float_path, calibration: np.ndarray,
                    folder) -> dict[str, tuple[dict, float]]:
    """`EDGE_FORMATS` written from `float_path` into `folder`: ``{key: (client request,
    minimum)}`` (none without ai-edge-quantizer, an optional extra)."""
    try:
        import ai_edge_quantizer  # noqa: F401

        from keras_mvit2.export.tflite.edge_quantizer import quantize_with_edge_quantizer
    except ImportError:
        return {}
    written = {}
    for key, (recipe, minimum) in EDGE_FORMATS.items():
        path = folder / f"classifier_{key}.tflite"
        quantize_with_edge_quantizer(float_path, path, recipe=recipe, calibration_images=(
            calibration.astype("float32") if recipe.startswith("static") else None))
        written[key] = ({"task": "classifier", "path": str(path), "key": key}, minimum)
    return written


def test_classifier_exports_classify_in_mediapipe_with_names(classifier, classifier_files, data,
                                                              tmp_path, record_property):
    x, _, test_x, test_y = data
    names = list(FASHION_MNIST_CLASSES)
    keras_top1 = np.asarray(classifier.predict(test_x / 255.0, verbose=0)).argmax(-1)
    assert np.mean(keras_top1 == test_y) >= 0.6  # trained: the agreement below means something
    models = []
    for key in CLASSIFIER_FORMATS:
        path = classifier_files[key]
        standard = read_tflite_metadata(path)["tflite_metadata"]
        assert standard["associatedFileContents"]["labels.txt"].splitlines() == names
        models.append({"task": "classifier", "path": str(path), "key": key})
    edge = _edge_quantized(classifier_files["float32"], x[:64] / 255.0, tmp_path)
    models += [request for request, _ in edge.values()]
    out = _run_mediapipe(tmp_path, test_x, models)
    minimums = {key: v[2] for key, v in CLASSIFIER_FORMATS.items()}
    minimums.update({key: minimum for key, (_, minimum) in edge.items()})
    agreement = {}
    for key, minimum in minimums.items():
        index = out[f"{key}.index"]
        agreement[key] = float(np.mean(index == keras_top1))
        assert [str(n) for n in out[f"{key}.names"]] == [names[i] for i in index], key
        assert agreement[key] >= minimum, (key, agreement)
    record_property("mediapipe_top1_agreement", json.dumps(agreement))
    print("MediaPipe ImageClassifier top-1 agreement with Keras:", agreement, file=sys.stderr)


def _skip_without(roads) -> None:
    if roads is None:
        pytest.skip("the PyTorch road needs torch and litert-torch (pip install -e "
                    "'.[torch,litert-torch]', then litert-torch and litert-converter "
                    "--no-deps: docs/install.md)")


def test_torch_road_file_gives_keras_and_the_tensorflow_roads_outputs(roads, record_property):
    _skip_without(roads)
    worker = roads["worker"]
    assert not worker["tf_after_import"] and not worker["tf_after_run"], \
        "the PyTorch road imported TensorFlow"
    x = roads["x"]
    keras_tf = np.asarray(roads["model"].predict(x, verbose=0))
    torch_file, tf_file = run_tflite(roads["torch"], x), run_tflite(roads["tensorflow"], x)
    scale = float(np.abs(keras_tf).max())
    diffs = {"torch_file_vs_keras": float(np.abs(torch_file - keras_tf).max()) / scale,
             "torch_file_vs_keras_on_torch": float(
                 np.abs(torch_file - roads["keras_torch"]).max()) / scale,
             "torch_file_vs_tensorflow_file": float(np.abs(torch_file - tf_file).max()) / scale}
    record_property("roads_relative_diffs", json.dumps(diffs))
    assert all(d <= ROADS_REL_TOL for d in diffs.values()), diffs
    assert np.array_equal(torch_file.argmax(-1), keras_tf.argmax(-1))
    # The other road, asked in the worker: the error names the backend and the fix.
    error = worker["torch_road"]["errors"]["tensorflow_road"]
    assert error.startswith("TensorFlowBackendRequiredError") and "'torch'" in error
    assert "KERAS_BACKEND=tensorflow" in error


def test_torch_road_int8_calibrates_on_images_it_reads_without_tensorflow(roads):
    """`convert(..., road="torch", quantization="int8", calibration_data="fashion_mnist")`
    (what `mvit2 export --road torch --quantization int8 --calibration-data D` passes):
    the images are read there with numpy + PIL, no TensorFlow; the file computes its
    convolutions and dense layers in int8 and keeps most of the Keras model's answers. This
    road's int8 is the weaker one (docs/int8.md, "Through the PyTorch road"): measured 66 %
    agreement on these 100 images (10 classes: 10 % by chance; images calibrated at another
    scale than [0, 1] would leave it near chance)."""
    _skip_without(roads)
    if roads["int8"] is None:
        pytest.skip("ai-edge-quantizer is not installed (the quantizer extra)")
    facts = roads["worker"]["torch_road"]["int8"]
    assert not facts["tf_after_int8"], "reading the calibration images imported TensorFlow"
    from model_utils import float_ops_from_interpreter

    left_float = float_ops_from_interpreter(roads["int8"])
    assert not {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"} & set(left_float), left_float
    keras_tf = np.asarray(roads["model"].predict(roads["x"], verbose=0))
    agreement = float(np.mean(run_tflite(roads["int8"], roads["x"]).argmax(-1)
                              == keras_tf.argmax(-1)))
    print(f"[torch road int8] agreement with Keras {agreement:.2f} on {len(keras_tf)} images, "
          f"{facts['seconds']:.0f} s, ops left in float {left_float}")
    assert agreement >= 0.5, agreement


def test_torch_road_file_carries_the_tensorflow_roads_metadata_and_signature(roads):
    _skip_without(roads)
    from ai_edge_litert.interpreter import Interpreter

    torch_meta = read_tflite_metadata(roads["torch"])
    tf_meta = read_tflite_metadata(roads["tensorflow"])
    assert torch_meta["converter"]["road"] == "torch"
    assert torch_meta["converter"]["tool"] == "litert-torch"
    assert "converter" not in tf_meta
    # The forms each road traced: the torch road sums tokens as a product and a mean.
    assert torch_meta["forms"] == {**tf_meta["forms"], "token_pooling": "product_mean",
                                   "road": "torch"}
    assert tf_meta["forms"]["token_pooling"] == "matmul"
    for key in ("format", "version", "model", "attention", "quantization", "batch_size",
                "preprocessing", "output_kind", "class_names", "calibration", "user"):
        assert torch_meta[key] == tf_meta[key], key
    for side in ("input", "output"):
        for key in ("shape", "dtype", "quantized", "scale", "zero_point"):
            assert torch_meta[side][key] == tf_meta[side][key], (side, key)
    # The standard metadata MediaPipe reads: the same (image input, normalization, labels.txt,
    # ...) but for the input tensor's own name, each file's (litert-torch names it
    # serving_default_args_0).
    standard = {road: json.loads(json.dumps(meta["tflite_metadata"]))
                for road, meta in (("torch", torch_meta), ("tensorflow", tf_meta))}
    for road, meta in (("torch", torch_meta), ("tensorflow", tf_meta)):
        tensor = standard[road]["subgraphMetadata"][0]["inputTensorMetadata"][0]
        assert tensor.pop("name") == meta["input"]["name"], road
    assert standard["torch"] == standard["tensorflow"]
    labels = torch_meta["tflite_metadata"]["associatedFileContents"]["labels.txt"]
    assert labels.splitlines() == roads["names"]
    signatures = {"serving_default": {"inputs": ["image"], "outputs": ["probabilities"]}}
    torch_interpreter = Interpreter(model_path=str(roads["torch"]))
    assert torch_interpreter.get_signature_list() == signatures
    assert Interpreter(model_path=str(roads["tensorflow"])).get_signature_list() == signatures
    x = roads["x"][:1]
    by_signature = torch_interpreter.get_signature_runner()(image=x)["probabilities"]
    np.testing.assert_array_equal(by_signature, run_tflite(roads["torch"], x))


def test_torch_road_file_classifies_in_mediapipe_with_names(roads, tmp_path, record_property):
    _skip_without(roads)
    keras_top1 = np.asarray(roads["model"].predict(roads["x"], verbose=0)).argmax(-1)
    out = _run_mediapipe(tmp_path, roads["pixels"], [
        {"task": "classifier", "path": str(roads["torch"]), "key": "torch_road"}])
    index = out["torch_road.index"]
    assert [str(n) for n in out["torch_road.names"]] == [roads["names"][i] for i in index]
    agreement = float(np.mean(index == keras_top1))
    record_property("mediapipe_torch_road_agreement", agreement)
    assert agreement >= 0.99, agreement


#: Images the PyTorch road's Core ML package is run on (its MIL program, in TensorFlow).
NUM_COREML = 20


def test_torch_road_coreml_package_gives_keras_outputs_and_the_tensorflow_roads_description(
        roads, tmp_path, record_property):
    """The float32 `.mlpackage` of the PyTorch road (torch.export + coremltools, made in the
    worker without TensorFlow): its own MIL program and weights, run here
    (`predict_with_package_weights`; Core ML itself needs macOS), give the Keras model's
    probabilities; its input, outputs, class labels and keras_mvit2 metadata are the
    TensorFlow road's package's."""
    _skip_without(roads)
    if roads["coreml"] is None:
        pytest.skip("the Core ML export needs coremltools (pip install -e '.[coreml]')")
    import json as json_module

    from keras_mvit2.export.coreml import (
        inspect_coreml,
        predict_with_package_weights,
        to_coreml,
    )
    from keras_mvit2.export.coreml.inspect import coreml_class_names

    worker = roads["worker"]["torch_road"]["coreml"]
    assert not worker["tf_after_coreml"], "the PyTorch road to Core ML imported TensorFlow"
    assert worker["keras_after_vs_before"] == 0.0, "converting changed the model's weights"
    x = roads["x"][:NUM_COREML]
    keras_out = np.asarray(roads["model"].predict(x, verbose=0))
    package_out = predict_with_package_weights(roads["model"], roads["coreml"], x)
    relative = float(np.abs(package_out - keras_out).max()) / float(np.abs(keras_out).max())
    record_property("coreml_torch_road_relative_diff", relative)
    assert relative <= ROADS_REL_TOL, relative
    assert np.array_equal(package_out.argmax(-1), keras_out.argmax(-1))

    tf_package = tmp_path / "tensorflow_road.mlpackage"
    tf_report = to_coreml(roads["model"], tf_package, quantization="float32",
                          class_names=roads["names"])
    torch_report = inspect_coreml(roads["coreml"])
    assert torch_report.op_histogram == worker["op_histogram"]
    assert torch_report.inputs == tf_report.inputs
    assert torch_report.outputs == tf_report.outputs
    assert coreml_class_names(roads["coreml"]) == coreml_class_names(tf_package) == roads["names"]
    ours = {k: v for k, v in torch_report.metadata.items() if k.startswith("keras_mvit2.")}
    converter = json_module.loads(ours.pop("keras_mvit2.converter"))
    assert converter["road"] == "torch" and converter["tool"] == "coremltools"
    assert ours == {k: v for k, v in tf_report.metadata.items() if k.startswith("keras_mvit2.")}


def test_torch_road_coreai_asset_describes_the_model_as_the_coreml_package_does(roads):
    """The Core AI asset (coreai-torch, made in the worker without TensorFlow): read here
    with coreai-core, it takes the model's input and gives one score per class, names the
    classes, and carries the Core ML packages' description of the model. Its outputs are
    not checked: Core AI's runtime loads assets on macOS only."""
    _skip_without(roads)
    if roads["coreai"] is None:
        pytest.skip("the Core AI export needs coreai-torch (pip install -e '.[coreai]')")
    from keras_mvit2.export import get_target, inspect_coreai, target_for_path
    from keras_mvit2.export.coreml import inspect_coreml

    worker = roads["worker"]["torch_road"]["coreai"]
    assert not worker["tf_after_coreai"], "the PyTorch road to Core AI imported TensorFlow"
    assert worker["keras_after_vs_before"] == 0.0, "converting changed the model's weights"
    asset = inspect_coreai(roads["coreai"])
    assert target_for_path(roads["coreai"]).name == "coreai"
    assert asset.num_ops == worker["num_ops"] and asset.functions == ["main"]
    size = f"1 × {ROADS_SIZE} × {ROADS_SIZE} × 3"
    assert asset.inputs == [("image", f"NDArray (Float32, {size})")]
    assert [kind for _, kind in asset.outputs] == ["NDArray (Float32, 1 × 10)"]
    assert asset.op_histogram["conv2d"] >= 82 and "custom" not in asset.op_histogram
    assert asset.metadata["keras_mvit2.class_names"] == roads["names"]
    converter = json.loads(asset.metadata["keras_mvit2.converter"])
    assert converter["road"] == "torch" and converter["tool"] == "coreai-torch"
    if roads["coreml"] is not None:  # the same description of the model as Core ML's
        package = inspect_coreml(roads["coreml"]).metadata
        for key in ("keras_mvit2.version", "keras_mvit2.model", "keras_mvit2.attention",
                    "keras_mvit2.preprocessing"):
            assert asset.metadata[key] == package[key], key
    target = get_target("coreai")
    assert target.class_names(roads["coreai"]) == roads["names"]
    if not target.can_run():
        with pytest.raises(RuntimeError, match="need macOS"):
            target.run(roads["coreai"], roads["x"][:1])


def test_standard_metadata_matches_the_input_quantization(classifier_files, data, tmp_path):
    """The int8 files with uint8 input: the classifier's (`classifier_files`) and one
    exported without class names (`tiny_mvit2`, calibrated on the first 100 training
    images), which carries no associated file (no labels.txt)."""
    from tiny_model import tiny_mvit2

    keras.utils.set_random_seed(0)
    no_names = tmp_path / "uint8_no_names.tflite"
    to_tflite(tiny_mvit2(input_shape=(SIZE, SIZE, 3)), no_names, quantization="int8",
              io_dtype="uint8", representative_data=data[0][:100])
    for path in (classifier_files["int8_uint8_io"], no_names):
        scale, zero_point = inspect_tflite(path).inputs[0].quantization
        meta = read_tflite_metadata(path)["tflite_metadata"]
        tensor = meta["subgraphMetadata"][0]["inputTensorMetadata"][0]
        normalization = tensor["processUnits"][0]["options"]
        # The client feeds raw pixels p; the model reads (p - zero_point) * scale = p / 255,
        # which is what the normalization (p - mean) / std says.
        assert tensor["content"]["contentPropertiesType"] == "ImageProperties", path
        assert tensor["content"]["contentProperties"]["colorSpace"] == "RGB", path
        pixels = np.arange(256.0)
        np.testing.assert_allclose((pixels - zero_point) * scale,
                                   (pixels - normalization["mean"][0]) / normalization["std"][0],
                                   atol=1e-6, err_msg=str(path))
    meta = read_tflite_metadata(no_names)["tflite_metadata"]
    assert "associatedFileContents" in meta and meta["associatedFileContents"] == {}


SEGMENTATION_CLASSES = ["background", *FASHION_MNIST_CLASSES]


def _segmentation_masks(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-pixel labels: the garment's class + 1 where the pixel is bright, else background."""
    return np.where(images[..., 0] > 40, labels[:, None, None] + 1, 0).astype("int64")


def client_segmenter(weights=None, backbone_weights=None) -> keras.Model:
    """The segmenter of this module: DeepLabV3 (MobileViTv2-0.5, ASPP 64) at 32x32."""
    from keras_mvit2.tasks import DeepLabV3

    return DeepLabV3(0.5, input_shape=(SIZE, SIZE, 3), classes=len(SEGMENTATION_CLASSES),
                     aspp_channels=64, weights=weights, backbone_weights=backbone_weights)


def train_segmenter(classifier_path) -> keras.Model:
    """`client_segmenter` on the trained classifier's backbone (`classifier_path`), fitted
    for one epoch in batches of 64 on the classifier's first 3,000 training images (Adam
    2e-3, seed 0). tests/make_checkpoints.py runs it (`client_segmenter.weights.h5`)."""
    import keras_mvit2 as mv

    trained = keras.saving.load_model(classifier_path)
    backbone = mv.mobilevitv2_050(input_shape=(SIZE, SIZE, 3), classes=10, weights=None)
    backbone.set_weights(trained.get_weights())
    x, y = load_fashion_mnist_arrays("train")
    x, y = client_rgb_uint8(x[:3000], SIZE), y[:3000].astype("int64")
    keras.utils.set_random_seed(0)
    model = client_segmenter(backbone_weights=backbone)
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x / 255.0, _segmentation_masks(x, y), batch_size=64, epochs=1, verbose=0)
    return model


@pytest.fixture(scope="module")
def segmenter():
    """The committed DeepLabV3 (`train_segmenter`: the trained classifier's backbone, one
    epoch on 3,000 images)."""
    return client_segmenter(weights=str(CHECKPOINTS / "client_segmenter.weights.h5"))


def test_segmenter_export_segments_in_mediapipe_with_names(segmenter, data, tmp_path,
                                                            record_property):
    test_x, test_y = data[2][:NUM_TEST], data[3][:NUM_TEST]
    keras_mask = np.asarray(segmenter.predict(test_x / 255.0, verbose=0)).argmax(-1)
    truth = _segmentation_masks(test_x, test_y)
    # Trained: better than calling every pixel background, and naming several classes.
    assert np.mean(keras_mask == truth) > np.mean(truth == 0) + 0.05
    assert len(np.unique(keras_mask)) >= 3
    path = tmp_path / "segmenter.tflite"
    to_tflite(segmenter, path, class_names=SEGMENTATION_CLASSES)
    out = _run_mediapipe(tmp_path, test_x, [{"task": "segmenter", "path": str(path),
                                             "key": "seg"}])
    assert [str(n) for n in out["seg.labels"]] == SEGMENTATION_CLASSES
    equal = float(np.mean(out["seg.mask"] == keras_mask))
    record_property("mediapipe_segmenter_pixel_equality", equal)
    print(f"MediaPipe ImageSegmenter category mask = Keras argmax on {equal:.4f} of pixels",
          file=sys.stderr)
    assert equal >= 0.98, equal


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    inter = np.prod(np.clip(np.minimum(a[2:], b[2:]) - np.maximum(a[:2], b[:2]), 0, None))
    union = np.prod(a[2:] - a[:2]) + np.prod(b[2:] - b[:2]) - inter
    return float(inter / union) if union > 0 else 0.0


def test_detector_with_postprocess_op_detects_in_mediapipe(trained_detector,
                                                           client_detector_tflite, tmp_path,
                                                           record_property):
    """The run's float32 `.tflite` of the detector with its post-processing op (score
    threshold DETECTOR_SCORE_THRESHOLD) and class names (conftest.py's
    `client_detector_tflite`, which tests/test_web.py loads too) in MediaPipe's
    ObjectDetector: the boxes of `postprocess_detections` on the Keras model's outputs."""
    from keras_mvit2.tasks import postprocess_detections

    model, images, names = trained_detector
    path = client_detector_tflite
    report = inspect_tflite(path)
    assert report.op_histogram.get("TFLite_Detection_PostProcess") == 1
    assert [t.shape for t in report.outputs] == [(1, 100, 4), (1, 100), (1, 100), (1,)]
    raw = np.asarray(model.predict(images / 255.0, verbose=0))
    expected = postprocess_detections(raw, model.anchors, model.anchor_config,
                                      score_threshold=DETECTOR_SCORE_THRESHOLD, top_k=100,
                                      max_detections=100)
    assert sum(len(d) for d in expected) >= NUM_TEST // 2  # trained: confident boxes
    out = _run_mediapipe(tmp_path, images, [{"task": "detector", "path": str(path),
                                             "key": "det"}])
    counts, ious, float_ious = [], [], []
    for i, want in enumerate(expected):
        mine = out["det.image"] == i
        boxes, classes = out["det.boxes"][mine], out["det.classes"][mine]
        counts.append((len(boxes), len(want)))
        for box, index, name in zip(boxes, classes, out["det.names"][mine], strict=True):
            # MediaPipe names the class from labels.txt (and then gives no index): the
            # name's position is the op's class, ours - 1.
            assert str(name) in names, (i, name)
            cls = names.index(str(name))
            assert index in (-1, cls), (i, index, name)
            candidates = np.nonzero(want.classes == cls + 1)[0]
            assert len(candidates), (i, name, want.classes)
            ious.append(max(_iou(box, client_pixels(want.boxes[j])) for j in candidates))
            float_ious.append(max(_iou(box / DETECTOR_SIZE, want.boxes[j]) for j in candidates))
    assert all(a == b for a, b in counts), [c for c in counts if c[0] != c[1]][:10]
    figures = {"images": NUM_TEST, "boxes": len(ious), "min_iou": min(ious),
               "mean_iou": float(np.mean(ious)),
               "mean_iou_vs_unrounded_boxes": float(np.mean(float_ious))}
    record_property("mediapipe_detector", json.dumps(figures))
    print("MediaPipe ObjectDetector vs postprocess_detections:", figures, file=sys.stderr)
    assert min(ious) >= 0.9, figures
