"""SSDLite as the Core ML pipeline Vision's object detection expects: the detector, then
coremltools' ``NonMaximumSuppression`` model, outputs ``confidence`` (boxes x classes) and
``coordinates`` (boxes x 4: center x, center y, width, height, normalized), so that
``VNCoreMLRequest`` returns ``VNRecognizedObjectObservation``s with the class names.

The first model is the SSDLite ML Program (image input, `keras_mvit2.export.to_coreml`)
with the decoding in the graph: ``raw_confidence`` ``(A, K)`` the softmax scores of the K
object classes (background dropped) and ``raw_coordinates`` ``(A, 4)`` the decoded boxes
(as `keras_mvit2.tasks.postprocess_detections` decodes them), the anchors as constants.
The second does per-class NMS with Core ML's builtin model.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

import keras

from keras_mvit2.export.class_names import check_object_names
from keras_mvit2.export.coreml.convert import to_coreml
from keras_mvit2.export.tflite.detection_postprocess import ssd_settings
from keras_mvit2.tasks.detection import decode_boxes
from keras_mvit2.utils.files import atomic_output

__all__ = ["to_coreml_detector"]


def _decoding_model(model: keras.Model) -> keras.Model:
    """image -> [raw_confidence (A, K), raw_coordinates (A, 4)] for a batch of one."""
    anchors, config, classes = ssd_settings(model)
    count = len(anchors)
    predictions = model.output
    confidence = keras.layers.Lambda(lambda p: keras.ops.reshape(
        keras.ops.softmax(p[..., 4:], axis=-1)[..., 1:], (count, classes)),
        name="raw_confidence")(predictions)
    coordinates = keras.layers.Lambda(lambda p: keras.ops.reshape(
        decode_boxes(p[..., :4], anchors, config.center_variance, config.size_variance),
        (count, 4)), name="raw_coordinates")(predictions)
    return keras.Model(model.input, [confidence, coordinates], name=f"{model.name}_decoded")


def _nms_spec(decoder_spec: Any, class_names: Sequence[str], iou_threshold: float,
              confidence_threshold: float) -> Any:
    import coremltools as ct

    spec = ct.proto.Model_pb2.Model()
    spec.specificationVersion = 5
    for source in decoder_spec.description.output:
        spec.description.input.add().CopyFrom(source)
    for source, name in zip(decoder_spec.description.output, ("confidence", "coordinates"),
                            strict=True):
        out = spec.description.output.add()
        out.CopyFrom(source)
        out.name = name
        width = int(source.type.multiArrayType.shape[1])
        del out.type.multiArrayType.shape[:]
        ranges = out.type.multiArrayType.shapeRange.sizeRanges
        ranges.add(lowerBound=0, upperBound=-1)
        ranges.add(lowerBound=width, upperBound=width)
    nms = spec.nonMaximumSuppression
    nms.confidenceInputFeatureName = spec.description.input[0].name
    nms.coordinatesInputFeatureName = spec.description.input[1].name
    nms.confidenceOutputFeatureName = "confidence"
    nms.coordinatesOutputFeatureName = "coordinates"
    nms.iouThreshold = float(iou_threshold)
    nms.confidenceThreshold = float(confidence_threshold)
    nms.pickTop.perClass = True
    nms.stringClassLabels.vector.extend([str(n) for n in class_names])
    return spec


def to_coreml_detector(
    model: keras.Model,
    path: str | os.PathLike,
    class_names: Sequence[str],
    *,
    iou_threshold: float = 0.5,
    confidence_threshold: float = 0.01,
    quantization: str = "float32",
    minimum_deployment_target: str = "iOS16",
) -> Any:
    """Saves an SSDLite model as a Vision-ready Core ML pipeline (see the module).

    Args:
        model: an `SSDLite` model with a fixed input size.
        path: the ``.mlpackage`` to write (atomically).
        class_names: the object classes, background excluded, in class-id order.
        iou_threshold: the NMS model's default IoU threshold.
        confidence_threshold: the NMS model's default confidence threshold.
        quantization: as in `keras_mvit2.export.to_coreml`; the default float32 keeps the
            decoder's outputs float32, the type the ``NonMaximumSuppression`` model takes
            (with float16 they are float16 arrays).
        minimum_deployment_target: as in `keras_mvit2.export.to_coreml`.

    Returns:
        The pipeline's ``coremltools.models.MLModel`` (predictions need macOS).

    Raises:
        ValueError: `class_names` do not match the model's object classes, or `path` is not
            an ``.mlpackage``.
    """
    import coremltools as ct

    path = os.fspath(path)
    if not path.endswith(".mlpackage"):
        raise ValueError(f"A Core ML pipeline is saved as .mlpackage. Received: path={path!r}")
    class_names = check_object_names(class_names, ssd_settings(model)[2])
    with tempfile.TemporaryDirectory() as tmp:
        decoder_path = os.path.join(tmp, "decoder.mlpackage")
        to_coreml(_decoding_model(model), decoder_path, quantization=quantization,
                  minimum_deployment_target=minimum_deployment_target)
        decoder = ct.models.MLModel(decoder_path, skip_model_load=True)
        spec = decoder.get_spec()
        for old, new in zip([o.name for o in spec.description.output],
                            ("raw_confidence", "raw_coordinates"), strict=True):
            ct.utils.rename_feature(spec, old, new)
        decoder = ct.models.MLModel(spec, weights_dir=decoder.weights_dir,
                                    skip_model_load=True)
        nms = ct.models.MLModel(_nms_spec(spec, class_names, iou_threshold,
                                          confidence_threshold), skip_model_load=True)
        pipeline = ct.utils.make_pipeline(decoder, nms)
        pipeline.short_description = "SSDLite + NonMaximumSuppression (Vision object detection)"
        pipeline.user_defined_metadata["classes"] = ",".join(str(n) for n in class_names)
        with atomic_output(path) as tmp_path:
            pipeline.save(tmp_path)
    return ct.models.MLModel(path, skip_model_load=True)
