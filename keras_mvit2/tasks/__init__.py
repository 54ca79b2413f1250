"""Downstream tasks on MobileViTv2 (paper Section 4.2, Tables 3, 4 and 11).

- `mobilevitv2_features`: multi-scale backbone, output stride 32 / 16 / 8 (dilation);
- segmentation: `DeepLabV3`, `PSPNet`, `SegmentationCrossEntropy` (ignore index),
  `SegmentationMeanIoU` / `confusion_matrix` / `mean_iou`;
- detection: `SSDLite`, `AnchorConfig` / `ssd_anchors`, `encode_boxes` / `decode_boxes`,
  `match_anchors`, `SSDLoss` (hard negative mining), `nms`, `postprocess_detections`,
  `coco_map` (pycocotools);
- `data`: the offline pasted Fashion-MNIST set and the Table 11 augmentations;
- `train`: Table 11 optimizer presets, compile / evaluate helpers, trivial baselines;
- `paper_tables`: the paper's Table 3 / 4 rows, `paper_comparison` (our sizes and MACs
  beside the paper's).

The models, their layers, losses and metrics are Keras 3 (`keras.ops`) and run on every
backend (TensorFlow, JAX, PyTorch); `import keras_mvit2` registers their classes, so a
task model's `.keras` file loads on each. `data`, `train`, `paper_tables` /
`paper_comparison` and `match_anchors` (the `tf.data` targets) need TensorFlow: on JAX and
PyTorch they raise `keras_mvit2.backend.TensorFlowBackendRequiredError` when first
used, and TensorFlow is not loaded.

The models export with `keras_mvit2.export.to_tflite` (float32 / int8) and `to_coreml`
like the classifier. Exported as they are, the detectors output the raw
``(1, anchors, 4 + classes)`` tensor, decoded and NMS-filtered outside the graph by
`postprocess_detections`. NMS can also run in the graph, with the settings of
`postprocess_detections`:
`keras_mvit2.export.with_detection_postprocess` ends the TFLite
model in the ``TFLite_Detection_PostProcess`` op (MediaPipe's ``ObjectDetector``), and
`keras_mvit2.export.to_coreml_detector` writes a Core ML pipeline ending
in ``NonMaximumSuppression`` (Vision's object detection). See docs/downstream.md.
"""

from keras_mvit2.backend import keras_backend_name, lazy_attributes
from keras_mvit2.models.mobilevitv2.mobilevitv2_features import (
    feature_strides,
    load_backbone_weights,
    mobilevitv2_features,
)
from keras_mvit2.tasks import detection, segmentation
from keras_mvit2.tasks.detection import (
    AnchorConfig,
    Detections,
    SSDLite,
    SSDLoss,
    anchors_for_model,
    coco_map,
    decode_boxes,
    encode_boxes,
    match_anchors,
    nms,
    postprocess_detections,
    ssd_anchors,
)
from keras_mvit2.tasks.segmentation import (
    DeepLabV3,
    PSPNet,
    SegmentationCrossEntropy,
    SegmentationMeanIoU,
    confusion_matrix,
    mean_iou,
)

#: TensorFlow-only (the `tf.data` pipelines, the training helpers, the MAC counts of the
#: profiler): imported here on the TensorFlow backend; on JAX and PyTorch on first use, where
#: they raise `keras_mvit2.backend.TensorFlowBackendRequiredError`. The rest (the
#: models, their layers, losses and metrics, anchors, boxes, NMS) runs on every backend.
_TENSORFLOW_ONLY = {
    "data": ("keras_mvit2.tasks.data", None),
    "train": ("keras_mvit2.tasks.train", None),
    "paper_tables": ("keras_mvit2.tasks.paper_tables", None),
    "paper_comparison": ("keras_mvit2.tasks.paper_tables", "paper_comparison"),
}
_TENSORFLOW_BACKEND = keras_backend_name() == "tensorflow"
if _TENSORFLOW_BACKEND:
    from keras_mvit2.tasks import data, train
    from keras_mvit2.tasks.paper_tables import paper_comparison

__all__ = [
    "AnchorConfig",
    "DeepLabV3",
    "Detections",
    "PSPNet",
    "SSDLite",
    "SSDLoss",
    "SegmentationCrossEntropy",
    "SegmentationMeanIoU",
    "anchors_for_model",
    "coco_map",
    "confusion_matrix",
    "data",
    "decode_boxes",
    "detection",
    "encode_boxes",
    "feature_strides",
    "load_backbone_weights",
    "match_anchors",
    "mean_iou",
    "mobilevitv2_features",
    "nms",
    "paper_comparison",
    "postprocess_detections",
    "segmentation",
    "ssd_anchors",
    "train",
]

if not _TENSORFLOW_BACKEND:  # `from keras_mvit2.tasks import *` loads no TensorFlow
    __all__ = [name for name in __all__ if name not in _TENSORFLOW_ONLY]

__getattr__ = lazy_attributes(__name__, _TENSORFLOW_ONLY)
