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

# TensorFlow-only: on JAX / PyTorch, a clear error instead of loading TensorFlow.
from keras_mvit2.utils.backend import require_tensorflow

require_tensorflow("keras_mvit2.tasks (the task models' data, training and export)")

from keras_mvit2.tasks import data, detection, segmentation, train
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
from keras_mvit2.tasks.features import (
    feature_strides,
    load_backbone_weights,
    mobilevitv2_features,
)
from keras_mvit2.tasks.paper_tables import paper_comparison
from keras_mvit2.tasks.segmentation import (
    DeepLabV3,
    PSPNet,
    SegmentationCrossEntropy,
    SegmentationMeanIoU,
    confusion_matrix,
    mean_iou,
)

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
