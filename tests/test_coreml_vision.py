"""Core ML packages shaped as Apple's Vision framework expects them (structure only: Core ML
predictions need macOS). Classifier: image input and class labels (tests/test_coreml_export.py).
Segmenter: image input, one score array per pixel (Vision's VNCoreMLFeatureValueObservation).
Detector: a pipeline ending in Core ML's NonMaximumSuppression model with ``confidence`` /
``coordinates`` outputs (Vision's VNRecognizedObjectObservation)."""

import keras
import numpy as np
import pytest

from keras_mvit2.export import to_coreml
from keras_mvit2.export.coreml.detection import _decoding_model, to_coreml_detector
from keras_mvit2.tasks import DeepLabV3, SSDLite
from keras_mvit2.tasks.detection import decode_boxes

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ct")]


def _image_input(spec, size):
    import coremltools as ct

    (feature,) = spec.description.input
    assert feature.type.WhichOneof("Type") == "imageType"
    image = feature.type.imageType
    assert (image.width, image.height) == size
    assert image.colorSpace == ct.proto.FeatureTypes_pb2.ImageFeatureType.RGB


def test_segmenter_package_is_vision_ready(ct, tmp_path):
    keras.utils.set_random_seed(0)
    model = DeepLabV3(0.5, input_shape=(32, 32, 3), classes=5, aspp_channels=16)
    to_coreml(model, tmp_path / "seg.mlpackage")
    spec = ct.models.MLModel(str(tmp_path / "seg.mlpackage"), skip_model_load=True).get_spec()
    _image_input(spec, (32, 32))
    (output,) = spec.description.output
    assert output.type.WhichOneof("Type") == "multiArrayType"
    assert list(output.type.multiArrayType.shape) == [1, 32, 32, 5]  # scores per pixel


def test_detector_pipeline_ends_in_non_maximum_suppression(ct, tmp_path):
    keras.utils.set_random_seed(0)
    model = SSDLite(0.5, input_shape=(64, 64, 3), classes=4)
    names = ["Trouser", "Sneaker", "Bag"]
    with pytest.raises(ValueError, match="3 object classes"):
        to_coreml_detector(model, tmp_path / "bad.mlpackage", names[:2])
    spec = to_coreml_detector(model, tmp_path / "det.mlpackage", names,
                              iou_threshold=0.45).get_spec()
    assert spec.WhichOneof("Type") == "pipeline"
    decoder, nms = spec.pipeline.models
    assert [decoder.WhichOneof("Type"), nms.WhichOneof("Type")] == [
        "mlProgram", "nonMaximumSuppression"]
    _image_input(spec, (64, 64))
    assert [o.name for o in spec.description.output] == ["confidence", "coordinates"]
    count = len(model.anchors)
    shapes = {o.name: list(o.type.multiArrayType.shape) for o in decoder.description.output}
    assert shapes == {"raw_confidence": [count, 3], "raw_coordinates": [count, 4]}
    options = nms.nonMaximumSuppression
    assert (options.confidenceInputFeatureName, options.coordinatesInputFeatureName) == (
        "raw_confidence", "raw_coordinates")
    assert (options.confidenceOutputFeatureName, options.coordinatesOutputFeatureName) == (
        "confidence", "coordinates")
    assert list(options.stringClassLabels.vector) == names
    assert options.pickTop.perClass and options.iouThreshold == pytest.approx(0.45)
    float32 = ct.proto.FeatureTypes_pb2.ArrayFeatureType.FLOAT32
    for output in spec.description.output:
        assert output.type.multiArrayType.dataType == float32
    # The graph converted for the decoder: object-class scores and centre-size boxes, as
    # postprocess_detections decodes them.
    x = np.random.default_rng(0).random((1, 64, 64, 3), dtype=np.float32)
    confidence, coordinates = (np.asarray(t) for t in _decoding_model(model)(x))
    raw = np.asarray(model(x))[0]
    scores = np.exp(raw[:, 4:]) / np.exp(raw[:, 4:]).sum(-1, keepdims=True)
    np.testing.assert_allclose(confidence, scores[:, 1:], atol=1e-6)
    np.testing.assert_allclose(coordinates, decode_boxes(raw[:, :4], model.anchors), atol=1e-6)
