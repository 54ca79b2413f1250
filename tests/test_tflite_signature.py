"""Every `.tflite` we write carries a ``serving_default`` SignatureDef (input ``image``, outputs
named for what they are), and LiteRT's signature runner computes exactly what index-based
invocation (and `run_tflite`) computes on the same input."""

import keras
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from keras_mvit2.export import read_tflite_metadata, run_tflite, to_tflite
from keras_mvit2.export.tflite.signature import add_serving_signature, serving_output_names

CALIBRATION = np.random.default_rng(1).random((16, 16, 12, 3), dtype=np.float32)


def _tiny(activation: str | None = "softmax", segmenter: bool = False) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 12, 3))
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    if segmenter:
        return keras.Model(inputs, keras.layers.Conv2D(3, 1)(x), name="tiny_segmenter")
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3, activation=activation)(x), name="tiny")


def _feeds(interpreter: Interpreter, batch: int = 1) -> list[np.ndarray]:
    """One input per model input, in [0, 1) (raw integers for a quantized input)."""
    rng = np.random.default_rng(0)
    feeds = []
    for detail in interpreter.get_input_details():
        shape = [batch, *(int(d) for d in detail["shape_signature"][1:])]
        dtype = np.dtype(detail["dtype"])
        if np.issubdtype(dtype, np.floating):
            feeds.append(rng.random(shape, dtype=np.float32).astype(dtype))
        else:
            info = np.iinfo(dtype)
            feeds.append(rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype))
    return feeds


def _by_index(path, feeds: list[np.ndarray]) -> list[np.ndarray]:
    interpreter = Interpreter(model_path=str(path))
    for detail, feed in zip(interpreter.get_input_details(), feeds, strict=True):
        interpreter.resize_tensor_input(detail["index"], list(feed.shape), strict=True)
    interpreter.allocate_tensors()
    for detail, feed in zip(interpreter.get_input_details(), feeds, strict=True):
        interpreter.set_tensor(detail["index"], feed)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]).copy() for d in interpreter.get_output_details()]


def _check_signature(path, outputs: list[str], batch: int = 1) -> dict[str, np.ndarray]:
    """The file's signature list is exactly ``serving_default``: image -> `outputs` (in the
    subgraph's output order; LiteRT lists the names sorted), and its runner returns the
    index-based outputs bit for bit."""
    interpreter = Interpreter(model_path=str(path))
    assert interpreter.get_signature_list() == {
        "serving_default": {"inputs": ["image"], "outputs": sorted(outputs)}}
    feeds = _feeds(interpreter, batch)
    got = interpreter.get_signature_runner("serving_default")(image=feeds[0])
    want = _by_index(path, feeds)
    assert sorted(got) == sorted(outputs)
    for name, expected in zip(outputs, want, strict=True):
        assert got[name].dtype == expected.dtype
        np.testing.assert_array_equal(got[name], expected)
    if np.issubdtype(feeds[0].dtype, np.floating) and len(outputs) == 1:
        np.testing.assert_array_equal(got[outputs[0]], run_tflite(path, feeds[0]))
    return got


@pytest.mark.parametrize(("quantization", "io_dtype"), [
    ("float32", "float32"), ("float16", "float32"), ("dynamic_int8", "float32"),
    ("int8", "float32"), ("int8", "uint8"), ("int8", "int8"), ("int16x8", "float32"),
    ("int16x8", "int16"),
])
def test_every_format_has_serving_default(tmp_path, quantization, io_dtype):
    path = tmp_path / f"{quantization}_{io_dtype}.tflite"
    data = CALIBRATION if quantization in ("int8", "int16x8") else None
    to_tflite(_tiny(), path, quantization=quantization, io_dtype=io_dtype,
              representative_data=data, class_names=["a", "b", "c"])
    _check_signature(path, ["probabilities"])
    # The metadata (JSON + the standard one with its labels) is still there after the edit.
    meta = read_tflite_metadata(path)
    assert meta["quantization"] == quantization and meta["class_names"] == ["a", "b", "c"]
    assert meta["tflite_metadata"]["associatedFileContents"] == {"labels.txt": "a\nb\nc\n"}


def test_logits_classifier_and_dynamic_batch(tmp_path):
    path = tmp_path / "logits.tflite"
    to_tflite(_tiny(activation=None), path, batch_size=None)
    got = _check_signature(path, ["logits"], batch=3)
    assert got["logits"].shape == (3, 3)


def test_segmenter_outputs_logits(tmp_path):
    path = tmp_path / "segmenter.tflite"
    to_tflite(_tiny(segmenter=True), path, class_names=["x", "y", "z"])
    assert _check_signature(path, ["logits"])["logits"].shape == (1, 16, 12, 3)


def test_names_follow_the_task_and_bad_names_are_refused(tmp_path):
    assert serving_output_names([(1, 10)], "probabilities") == ["probabilities"]
    assert serving_output_names([(1, 8, 8, 3)]) == ["logits"]
    assert serving_output_names([(1, 100, 9)]) == ["raw_predictions"]
    assert serving_output_names([(1, 10, 4), (1, 10), (1, 10), (1,)]) == [
        "location", "category", "score", "number of detections"]
    with pytest.raises(ValueError, match="output_kind"):
        serving_output_names([(1, 10)], "softmax")
    path = tmp_path / "m.tflite"
    to_tflite(_tiny(), path)
    with pytest.raises(ValueError, match="one distinct output name per output tensor"):
        add_serving_signature(path.read_bytes(), ["a", "b"])


@pytest.mark.slow
@pytest.mark.parametrize("postprocess", [False, True])
def test_detector_signature(tmp_path, postprocess):
    from keras_mvit2.export.tflite.detection_postprocess import with_detection_postprocess
    from keras_mvit2.tasks import SSDLite

    keras.utils.set_random_seed(0)
    model = SSDLite(0.5, input_shape=(64, 64, 3), classes=4)
    if postprocess:
        model = with_detection_postprocess(model, score_threshold=0.26)
    path = tmp_path / "detector.tflite"
    to_tflite(model, path, class_names=["a", "b", "c"] if postprocess else None)
    names = (["location", "category", "score", "number of detections"] if postprocess
             else ["raw_predictions"])
    got = _check_signature(path, names)
    if postprocess:  # the names are the standard metadata's (MediaPipe's ObjectDetector)
        outputs = read_tflite_metadata(path)["tflite_metadata"]["subgraphMetadata"][0][
            "outputTensorMetadata"]
        assert [o["name"] for o in outputs] == names
        assert got["number of detections"].shape == (1,)
