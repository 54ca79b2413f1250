"""Standard TFLite Model Metadata and the in-graph detection post-processing, checked in
LiteRT (no MediaPipe needed; tests/test_mediapipe_clients.py loads the files in MediaPipe)."""

import zipfile

import keras
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from keras_mvit2.export import read_tflite_metadata, run_tflite, to_tflite

NAMES = ["cat", "dog", "bird"]


def _tiny_classifier() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 12, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x), name="tiny")


def test_classifier_file_holds_standard_metadata_and_still_runs(tmp_path):
    model = _tiny_classifier()
    path = tmp_path / "tiny.tflite"
    report = to_tflite(model, path, class_names=NAMES, sidecar=True)
    meta = read_tflite_metadata(path)
    assert meta["class_names"] == NAMES  # our JSON entry is kept
    standard = meta["tflite_metadata"]
    assert standard["minParserVersion"] == "1.0.0"
    graph = standard["subgraphMetadata"][0]
    image = graph["inputTensorMetadata"][0]
    assert image["content"]["contentProperties"] == {
        "colorSpace": "RGB", "defaultSize": {"width": 12, "height": 16}}
    assert image["processUnits"] == [{"optionsType": "NormalizationOptions",
                                      "options": {"mean": [0.0], "std": [255.0]}}]
    output = graph["outputTensorMetadata"][0]
    assert output["name"] == "probability" and output["stats"] == {"max": [1.0], "min": [0.0]}
    assert output["associatedFiles"][0]["type"] == "TENSOR_AXIS_LABELS"
    assert standard["associatedFileContents"] == {"labels.txt": "cat\ndog\nbird\n"}
    # The labels archive is a plain (stored) zip appended to a model LiteRT still runs.
    with zipfile.ZipFile(path) as archive:
        assert [i.compress_type for i in archive.infolist()] == [zipfile.ZIP_STORED]
    x = np.random.default_rng(0).random((1, 16, 12, 3), dtype=np.float32)
    np.testing.assert_allclose(run_tflite(path, x), model(x), atol=1e-5)
    assert report.metadata == meta


def test_the_same_model_exports_to_the_same_bytes_at_another_time(tmp_path, monkeypatch):
    """Reproducible files: the labels archive's dates do not follow the clock (zip stores
    the time of day in 2 s steps, so a day apart would show)."""
    import time

    model = _tiny_classifier()
    to_tflite(model, tmp_path / "first.tflite", class_names=NAMES)
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 86_400 + 3_601)
    to_tflite(model, tmp_path / "later.tflite", class_names=NAMES)
    first = (tmp_path / "first.tflite").read_bytes()
    assert zipfile.is_zipfile(tmp_path / "first.tflite")
    assert first == (tmp_path / "later.tflite").read_bytes()


def test_class_names_for_a_detector_count_object_classes(tmp_path):
    from keras_mvit2.export.tflite.detection_postprocess import with_detection_postprocess
    from keras_mvit2.tasks import SSDLite

    ssd = SSDLite(0.5, input_shape=(64, 64, 3), classes=4)
    with pytest.raises(ValueError, match="3 object classes"):
        to_tflite(with_detection_postprocess(ssd), tmp_path / "d.tflite", class_names=NAMES[:2])


@pytest.mark.slow
def test_detection_postprocess_op_equals_postprocess_detections(tmp_path):
    from keras_mvit2.export.tflite.detection_postprocess import with_detection_postprocess
    from keras_mvit2.tasks import SSDLite, postprocess_detections

    keras.utils.set_random_seed(0)
    ssd = SSDLite(0.5, input_shape=(64, 64, 3), classes=4)
    threshold = 0.26  # untrained: scores near 1/4, many boxes over it
    path = tmp_path / "detector.tflite"
    report = to_tflite(with_detection_postprocess(ssd, score_threshold=threshold), path,
                       class_names=NAMES)
    assert report.op_histogram["TFLite_Detection_PostProcess"] == 1
    outputs = read_tflite_metadata(path)["tflite_metadata"]["subgraphMetadata"][0][
        "outputTensorMetadata"]
    assert [o["name"] for o in outputs] == ["location", "category", "score",
                                            "number of detections"]
    interpreter = Interpreter(model_path=str(path))
    interpreter.allocate_tensors()
    total = 0
    for seed in range(3):
        x = np.random.default_rng(seed).random((1, 64, 64, 3), dtype=np.float32)
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
        interpreter.invoke()
        boxes, classes, scores, count = (interpreter.get_tensor(d["index"])
                                         for d in interpreter.get_output_details())
        want = postprocess_detections(np.asarray(ssd(x)), ssd.anchors, score_threshold=threshold,
                                      top_k=100, max_detections=100)[0]
        n = int(count[0])
        total += n
        assert n == len(want)
        np.testing.assert_allclose(scores[0, :n], want.scores, atol=1e-5)
        np.testing.assert_array_equal(classes[0, :n] + 1, want.classes)
        np.testing.assert_allclose(boxes[0, :n][:, [1, 0, 3, 2]], want.boxes, atol=1e-5)
    assert total >= 30
