"""SSDLite ending in TFLite's ``TFLite_Detection_PostProcess`` op, the way mobile detectors
ship (MediaPipe's ``ObjectDetector``, the TFLite Task Library).

`with_detection_postprocess` wraps an `keras_mvit2.tasks.SSDLite` model into one with two
outputs: the box encodings of the boxes clipped to the image (as
`keras_mvit2.tasks.postprocess_detections` clips them before NMS), reordered to the op's
``(ty, tx, th, tw)`` ``(1, A, 4)``, and the
class scores (softmax, as `keras_mvit2.tasks.postprocess_detections` computes them)
``(1, A, C)``. `to_tflite` converts it like any model, then `append_detection_postprocess`
adds the op to the flatbuffer, fed by those two tensors and the anchors ``(cy, cx, h, w)``
as a constant, and makes its four outputs the model's: boxes ``(1, N, 4)`` (ymin, xmin,
ymax, xmax in [0, 1]), classes ``(1, N)`` (object class index from 0, i.e. our class id - 1,
as float), scores ``(1, N)`` and the number of detections ``(1,)``. (TF 2.21's
``from_concrete_functions`` inlines a ``tf.function(experimental_implements=
"TFLite_Detection_PostProcess")`` before the converter can see it, so the op is added to the
flatbuffer directly; its options are the flexbuffer map the kernel parses.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import keras
import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema
from flatbuffers import flexbuffers

from keras_mvit2.export.class_names import check_object_names
from keras_mvit2.export.tflite.flatbuffer import (
    parse_flatbuffer,
    serialize_flatbuffer,
    tensor_indices,
)
from keras_mvit2.export.tflite.signature import tensor_map
from keras_mvit2.tasks.detection import (
    AnchorConfig,
    anchors_for_model,
    center_to_corner,
    corner_to_center,
    decode_boxes,
    encode_boxes,
)

__all__ = ["OP_NAME", "PostProcessOptions", "add_detection_postprocess",
           "append_detection_postprocess",
           "check_object_names", "ssd_settings", "with_detection_postprocess"]

#: The op's custom code (a custom op that every LiteRT / TFLite build registers).
OP_NAME = "TFLite_Detection_PostProcess"


@dataclass(frozen=True)
class PostProcessOptions:
    """The op's options (the kernel's flexbuffer keys).

    Attributes:
        num_classes: object classes (background excluded).
        max_detections: boxes returned.
        detections_per_class: per-class candidates kept before NMS (``top_k``).
        nms_score_threshold: scores above it are candidates.
        nms_iou_threshold: a box is dropped when its IoU with a kept box of its class is
            above it.
        y_scale, x_scale, h_scale, w_scale: box coding, 1 / the SSD variances.
    """

    num_classes: int
    max_detections: int = 100
    detections_per_class: int = 100
    nms_score_threshold: float = 0.01
    nms_iou_threshold: float = 0.5
    y_scale: float = 10.0
    x_scale: float = 10.0
    h_scale: float = 5.0
    w_scale: float = 5.0

    def flexbuffer(self) -> bytes:
        # Per-class NMS, one class per box: what postprocess_detections does.
        return bytes(flexbuffers.Dumps({
            **asdict(self), "max_classes_per_detection": 1, "use_regular_nms": True,
        }))


def ssd_settings(model: keras.Model) -> tuple[np.ndarray, AnchorConfig, int]:
    """An SSDLite model's anchors ``(A, 4)`` ``(cx, cy, w, h)`` float32, its `AnchorConfig`
    and its number of object classes (background excluded)."""
    anchors = getattr(model, "anchors", None)
    if anchors is None:
        anchors = anchors_for_model(model)
    config = getattr(model, "anchor_config", None) or AnchorConfig()
    return np.asarray(anchors, np.float32), config, int(model.output_shape[-1]) - 5


def with_detection_postprocess(
    model: keras.Model,
    *,
    max_detections: int = 100,
    detections_per_class: int = 100,
    score_threshold: float = 0.01,
    iou_threshold: float = 0.5,
) -> keras.Model:
    """An SSDLite model to export with ``TFLite_Detection_PostProcess`` at the end.

    ``to_tflite(with_detection_postprocess(model), path, class_names=object_names)``
    writes a file whose outputs are the op's four, with the standard metadata
    (``location``, ``category`` with ``labels.txt``, ``score``, ``number of detections``)
    that MediaPipe's ObjectDetector and the Task Library read. `object_names` are the object
    classes, background excluded. The settings mirror `keras_mvit2.tasks.postprocess_detections`
    (per-class NMS on softmax scores above `score_threshold`, IoU above `iou_threshold`
    suppressed, the `max_detections` best overall; `detections_per_class` is its ``top_k``).
    Only float outputs (``io_dtype="float32"``) are supported.

    Args:
        model: an `SSDLite` model with a fixed input size; exported with batch 1.

    Returns:
        A Keras model: image ``(batch, H, W, 3)`` -> ``[encodings (batch, A, 4), scores
        (batch, A, C)]``, with the op's settings in ``detection_postprocess``.

    Raises:
        ValueError: not an SSDLite model, a model built for any input size, or settings < 1.
    """
    anchors_cxcywh, config, num_classes = ssd_settings(model)
    if min(max_detections, detections_per_class) < 1:
        raise ValueError("max_detections and detections_per_class must be >= 1. Received: "
                         f"{max_detections}, {detections_per_class}")
    predictions = model.output

    def clipped_encodings(p):
        # postprocess_detections clips the boxes to the image before NMS (which changes
        # some IoUs); the op does not clip, so it is given the encodings of clipped boxes.
        boxes = center_to_corner(decode_boxes(p[..., :4], anchors_cxcywh,
                                              config.center_variance, config.size_variance))
        centers = corner_to_center(keras.ops.clip(boxes, 0.0, 1.0))
        centers = keras.ops.concatenate(
            [centers[..., :2], keras.ops.maximum(centers[..., 2:], 1e-6)], axis=-1)
        encoded = encode_boxes(centers, anchors_cxcywh, config.center_variance,
                               config.size_variance)
        return keras.ops.take(encoded, [1, 0, 3, 2], axis=-1)

    encodings = keras.layers.Lambda(clipped_encodings, name="box_encodings_yx")(predictions)
    scores = keras.layers.Softmax(name="class_scores")(
        keras.layers.Lambda(lambda p: p[..., 4:], name="class_logits")(predictions)
    )
    wrapper = keras.Model(model.input, [encodings, scores], name=f"{model.name}_postprocessed")
    wrapper.detection_postprocess = PostProcessOptions(
        num_classes=num_classes,
        max_detections=int(max_detections), detections_per_class=int(detections_per_class),
        nms_score_threshold=float(score_threshold), nms_iou_threshold=float(iou_threshold),
        y_scale=1.0 / config.center_variance, x_scale=1.0 / config.center_variance,
        h_scale=1.0 / config.size_variance, w_scale=1.0 / config.size_variance,
    )
    wrapper.anchors_yxhw = anchors_cxcywh[:, [1, 0, 3, 2]]
    return wrapper


def append_detection_postprocess(flatbuffer: bytes, anchors_yxhw: np.ndarray,
                                 options: PostProcessOptions) -> bytes:
    """`flatbuffer` (the converted `with_detection_postprocess` model, outputs encodings
    ``(1, A, 4)`` then scores ``(1, A, C)``, float32) with the op appended and its four
    outputs as the model's outputs (and signature's)."""
    model = parse_flatbuffer(flatbuffer)
    add_detection_postprocess(model, anchors_yxhw, options)
    return serialize_flatbuffer(model, len(flatbuffer) + anchors_yxhw.nbytes + 4096)


def add_detection_postprocess(model: Any, anchors_yxhw: np.ndarray,
                              options: PostProcessOptions) -> None:
    """`append_detection_postprocess` on a parsed model (`ModelT`, edited in place)."""
    graph = model.subgraphs[0]
    outputs = tensor_indices(graph.outputs)
    shapes = [tensor_indices(graph.tensors[i].shape) for i in outputs]
    count = len(anchors_yxhw)
    if len(outputs) != 2 or shapes[0] != [1, count, 4] or shapes[1][:2] != [1, count]:
        raise ValueError(
            "append_detection_postprocess needs the two outputs of with_detection_postprocess "
            f"(1, {count}, 4) and (1, {count}, classes), batch 1. Received: {shapes}. Fix: "
            "export with batch_size=1."
        )
    if any(graph.tensors[i].type != tfl_schema.TensorType.FLOAT32 for i in outputs):
        raise ValueError("TFLite_Detection_PostProcess is added to float outputs only: "
                         "export with io_dtype='float32'.")

    def add_tensor(name: str, shape: list[int], data: np.ndarray | None = None) -> int:
        tensor = tfl_schema.TensorT()
        tensor.name, tensor.type = name, tfl_schema.TensorType.FLOAT32
        tensor.shape = np.asarray(shape, np.int32)
        tensor.buffer = 0  # the empty buffer
        if data is not None:
            buffer = tfl_schema.BufferT()
            buffer.data = np.frombuffer(np.ascontiguousarray(data, np.float32).tobytes(),
                                        np.uint8)
            model.buffers.append(buffer)
            tensor.buffer = len(model.buffers) - 1
        graph.tensors.append(tensor)
        return len(graph.tensors) - 1

    anchors = add_tensor("anchors", [count, 4], anchors_yxhw)
    n = options.max_detections
    results = [add_tensor(OP_NAME + suffix, shape) for suffix, shape in
               (("", [1, n, 4]), (":1", [1, n]), (":2", [1, n]), (":3", [1]))]
    code = tfl_schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = tfl_schema.BuiltinOperator.CUSTOM
    code.customCode, code.version = OP_NAME, 1
    model.operatorCodes.append(code)
    op = tfl_schema.OperatorT()
    op.opcodeIndex = len(model.operatorCodes) - 1
    op.inputs = np.asarray([*outputs, anchors], np.int32)
    op.outputs = np.asarray(results, np.int32)
    op.customOptions = np.frombuffer(options.flexbuffer(), np.uint8)
    op.customOptionsFormat = tfl_schema.CustomOptionsFormat.FLEXBUFFERS
    graph.operators.append(op)
    graph.outputs = np.asarray(results, np.int32)
    for signature in model.signatureDefs or []:
        signature.outputs = [tensor_map(name, index) for name, index in zip(
            ("detection_boxes", "detection_classes", "detection_scores", "num_detections"),
            results, strict=True)]
