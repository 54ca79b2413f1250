"""Object detection on MobileViTv2: SSDLite (separable-conv SSD head), SSD anchors, box
encoding, anchor matching, the SSD multibox loss with hard negative mining,
non-maximum suppression and COCO mAP.

Follows ml-cvnets (`cvnets/models/detection/ssd.py`, `cvnets/modules/ssd_heads.py`,
`cvnets/anchor_generator/ssd_anchor_generator.py`, `cvnets/matcher_det/ssd_matcher.py`,
`loss_fn/detection/ssd_multibox_loss.py`) with the paper's COCO settings
(`config/detection/ssd_coco/mobilevit_v2.yaml`): feature maps at output strides
16, 32, 64, 128, 256 and a global one (-1); aspect ratios (2, 3) (and (2,) for the
global map); scales from 0.1 to 1.05; head projections (512, 256, 256, 128, 128, 64);
center/size variances 0.1/0.2; IoU threshold 0.5; ReLU in the extra layers and heads.

Conventions:

- boxes are normalized to [0, 1]; "corner" boxes are `(x1, y1, x2, y2)`, "center"
  boxes (anchors) `(cx, cy, w, h)`;
- class 0 is the background; object classes are `1 .. num_classes - 1`;
- the model outputs one tensor `(batch, num_anchors, 4 + num_classes)`: the encoded
  box offsets (4) then the class logits. `postprocess_detections` decodes it and
  runs NMS outside the graph (in numpy), so exported TFLite / Core ML files hold no
  custom op; the anchors are stored on the model (`model.anchors`) and in
  `ssd_anchors(...)`.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import keras
import numpy as np
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.backend import forms as backend_forms
from keras_mvit2.backend import require_tensorflow
from keras_mvit2.layers.inverted_residual import batch_norm
from keras_mvit2.models.input_size import has_dynamic_size, with_input_size
from keras_mvit2.models.mobilevitv2.mobilevitv2_features import mobilevitv2_features
from keras_mvit2.tasks.segmentation import _check_classes, _load_model_weights

__all__ = [
    "AnchorConfig",
    "Detections",
    "SSDLite",
    "SSDLoss",
    "anchors_for_model",
    "center_to_corner",
    "coco_map",
    "corner_to_center",
    "decode_boxes",
    "encode_boxes",
    "hard_negative_mask",
    "iou_matrix",
    "match_anchors",
    "nms",
    "postprocess_detections",
    "ssd_anchors",
]


# --------------------------------------------------------------------------------------
# Anchors and box coding


@dataclass(frozen=True)
class AnchorConfig:
    """SSD anchor settings (ml-cvnets `anchor_generator.ssd.*`, `matcher.ssd.*`).

    Attributes:
        output_strides: strides of the prediction maps; `-1` is a global (1x1) map.
        aspect_ratios: per stride, the aspect ratios `r` (each adds two boxes,
            `(s sqrt(r), s / sqrt(r))` and its transpose).
        min_scale, max_scale: box scales are `linspace(min, max, levels + 1)`; level
            `i` has a small box of side `scale[i]` and a big one of side
            `sqrt(scale[i] scale[i + 1])`.
        clip: clip anchors to [0, 1] (ml-cvnets default).
        center_variance, size_variance: box-coding variances.
        iou_threshold: anchor/object IoU needed for a positive anchor.
    """

    output_strides: tuple[int, ...] = (16, 32, 64, 128, 256, -1)
    aspect_ratios: tuple[tuple[float, ...], ...] = ((2, 3),) * 5 + ((2,),)
    min_scale: float = 0.1
    max_scale: float = 1.05
    clip: bool = True
    center_variance: float = 0.1
    size_variance: float = 0.2
    iou_threshold: float = 0.5

    def __post_init__(self):
        if len(self.output_strides) != len(self.aspect_ratios):
            raise ValueError(
                "AnchorConfig needs one aspect-ratio list per output stride. Received "
                f"{len(self.output_strides)} strides and {len(self.aspect_ratios)} lists."
            )
        for s in self.output_strides:
            if s != -1 and (s < 8 or s & (s - 1)):
                raise ValueError(
                    f"output_strides must be powers of two >= 8, or -1. Received: {s}"
                )
        if -1 in self.output_strides[:-1]:
            raise ValueError("-1 (global map) can only be the last output stride.")
        if not 0.0 < self.min_scale < self.max_scale:
            raise ValueError("Need 0 < min_scale < max_scale.")

    def num_anchors_per_location(self) -> list[int]:
        """`2 + 2 len(ratios)` per level (ml-cvnets `num_anchors_per_os`)."""
        return [2 + 2 * len(_unique(r)) for r in self.aspect_ratios]

    def scales(self) -> np.ndarray:
        return np.linspace(self.min_scale, self.max_scale, len(self.output_strides) + 1)

    def to_dict(self) -> dict:
        return {
            "output_strides": list(self.output_strides),
            "aspect_ratios": [list(r) for r in self.aspect_ratios],
            "min_scale": self.min_scale, "max_scale": self.max_scale, "clip": self.clip,
            "center_variance": self.center_variance, "size_variance": self.size_variance,
            "iou_threshold": self.iou_threshold,
        }

    @classmethod
    def from_dict(cls, config: dict) -> AnchorConfig:
        config = dict(config)
        config["output_strides"] = tuple(config["output_strides"])
        config["aspect_ratios"] = tuple(tuple(r) for r in config["aspect_ratios"])
        return cls(**config)


def _unique(ratios: Sequence[float]) -> list[float]:
    return list(dict.fromkeys(ratios))


def ssd_anchors(
    feature_sizes: Sequence[tuple[int, int]], config: AnchorConfig = AnchorConfig()
) -> np.ndarray:
    """SSD anchors `(num_anchors, 4)` as `(cx, cy, w, h)`, float32, normalized.

    Order: level by level; in a level row-major over the map (y, then x); at each
    location the small square, the big square, then for each ratio `r` the boxes
    `(s sqrt(r), s / sqrt(r))` and `(s / sqrt(r), s sqrt(r))` (ml-cvnets order).
    Centers are `((x + 0.5) / W, (y + 0.5) / H)`.

    Args:
        feature_sizes: `(height, width)` of each prediction map, one per level.
        config: the anchor settings.
    """
    if len(feature_sizes) != len(config.output_strides):
        raise ValueError(
            f"Need one feature size per output stride ({len(config.output_strides)}). "
            f"Received: {feature_sizes}"
        )
    scales = config.scales()
    levels = []
    for i, ((height, width), ratios) in enumerate(
        zip(feature_sizes, config.aspect_ratios, strict=True)
    ):
        small = scales[i]
        big = math.sqrt(scales[i] * scales[i + 1])
        shapes = [(small, small), (big, big)]
        for r in _unique(ratios):
            q = math.sqrt(r)
            shapes += [(small * q, small / q), (small / q, small * q)]
        ys, xs = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
        cx = (xs.reshape(-1, 1) + 0.5) / width
        cy = (ys.reshape(-1, 1) + 0.5) / height
        wh = np.asarray(shapes, dtype=np.float64)  # (k, 2)
        k = len(shapes)
        level = np.empty((height * width, k, 4), np.float64)
        level[..., 0] = cx
        level[..., 1] = cy
        level[..., 2] = wh[None, :, 0]
        level[..., 3] = wh[None, :, 1]
        levels.append(level.reshape(-1, 4))
    anchors = np.concatenate(levels, axis=0)
    if config.clip:
        anchors = np.clip(anchors, 0.0, 1.0)
    return anchors.astype(np.float32)


def center_to_corner(boxes):
    """`(cx, cy, w, h)` -> `(x1, y1, x2, y2)` (numpy or tensors, last axis 4)."""
    xp = np if isinstance(boxes, np.ndarray) else ops
    cxcy, wh = boxes[..., :2], boxes[..., 2:4]
    return xp.concatenate([cxcy - wh / 2, cxcy + wh / 2], axis=-1)


def corner_to_center(boxes):
    """`(x1, y1, x2, y2)` -> `(cx, cy, w, h)` (numpy or tensors, last axis 4)."""
    xp = np if isinstance(boxes, np.ndarray) else ops
    x1y1, x2y2 = boxes[..., :2], boxes[..., 2:4]
    return xp.concatenate([(x1y1 + x2y2) / 2, x2y2 - x1y1], axis=-1)


def encode_boxes(boxes_cxcywh, anchors_cxcywh, center_variance: float = 0.1,
                 size_variance: float = 0.2):
    """SSD regression targets (Eq. 2 of Liu et al.): center offsets in anchor units over
    `center_variance`, log size ratios over `size_variance`. Numpy or tensors."""
    xp = np if isinstance(boxes_cxcywh, np.ndarray) else ops
    centers = (boxes_cxcywh[..., :2] - anchors_cxcywh[..., :2]) / (
        anchors_cxcywh[..., 2:] * center_variance
    )
    sizes = xp.log(boxes_cxcywh[..., 2:] / anchors_cxcywh[..., 2:]) / size_variance
    return xp.concatenate([centers, sizes], axis=-1)


def decode_boxes(locations, anchors_cxcywh, center_variance: float = 0.1,
                 size_variance: float = 0.2):
    """Inverse of `encode_boxes`: center-form boxes from predicted offsets."""
    xp = np if isinstance(locations, np.ndarray) else ops
    centers = locations[..., :2] * center_variance * anchors_cxcywh[..., 2:] + (
        anchors_cxcywh[..., :2]
    )
    sizes = xp.exp(locations[..., 2:] * size_variance) * anchors_cxcywh[..., 2:]
    return xp.concatenate([centers, sizes], axis=-1)


def iou_matrix(boxes_a, boxes_b):
    """Pairwise IoU `(len(a), len(b))` of corner boxes (numpy or the backend's tensors)."""
    if isinstance(boxes_a, np.ndarray) and isinstance(boxes_b, np.ndarray):
        xp, maximum, minimum = np, np.maximum, np.minimum
    else:
        xp, maximum, minimum = ops, ops.maximum, ops.minimum
    a = boxes_a[:, None, :]
    b = boxes_b[None, :, :]
    x1 = maximum(a[..., 0], b[..., 0])
    y1 = maximum(a[..., 1], b[..., 1])
    x2 = minimum(a[..., 2], b[..., 2])
    y2 = minimum(a[..., 3], b[..., 3])
    inter = maximum(x2 - x1, 0.0) * maximum(y2 - y1, 0.0)
    area_a = maximum(a[..., 2] - a[..., 0], 0.0) * maximum(a[..., 3] - a[..., 1], 0.0)
    area_b = maximum(b[..., 2] - b[..., 0], 0.0) * maximum(b[..., 3] - b[..., 1], 0.0)
    union = area_a + area_b - inter
    return inter / xp.maximum(union, 1e-12)


def match_anchors(gt_boxes, gt_labels, anchors_cxcywh, config: AnchorConfig = AnchorConfig()):
    """Assigns objects to anchors (ml-cvnets `SSDMatcher` / `assign_priors`), in TF.

    Every anchor takes the object it overlaps most; anchors below
    `config.iou_threshold` become background (label 0); then each object takes its
    best anchor whatever the IoU (so no object is left without an anchor; when two
    objects share a best anchor the later one keeps it, as the reference's loop).

    Args:
        gt_boxes: `(n, 4)` corner boxes, normalized; `n` may be 0.
        gt_labels: `(n,)` int labels in `1 .. num_classes - 1`.
        anchors_cxcywh: `(A, 4)` anchors.
        config: variances and IoU threshold.

    Returns:
        `(locations (A, 4) float32, labels (A,) int32)`: regression targets
        (`encode_boxes` of the matched box; zeros for background) and labels.

    Raises:
        TensorFlowBackendRequiredError: on JAX and PyTorch (it builds the `tf.data` targets
            of `keras_mvit2.tasks.data`, TensorFlow-only).
    """
    require_tensorflow("keras_mvit2.tasks.match_anchors (the tf.data detection targets)")
    import tensorflow as tf

    gt_boxes = tf.convert_to_tensor(gt_boxes, tf.float32)
    gt_labels = tf.cast(tf.convert_to_tensor(gt_labels), tf.int32)
    anchors = tf.convert_to_tensor(anchors_cxcywh, tf.float32)
    num_anchors = tf.shape(anchors)[0]
    num_gt = tf.shape(gt_boxes)[0]

    def empty():
        return tf.zeros((num_anchors, 4), tf.float32), tf.zeros((num_anchors,), tf.int32)

    def assign():
        ious = iou_matrix(gt_boxes, center_to_corner(anchors))           # (n, A)
        best_gt = tf.argmax(ious, axis=0, output_type=tf.int32)           # (A,)
        best_iou = tf.reduce_max(ious, axis=0)
        best_anchor = tf.argmax(ious, axis=1, output_type=tf.int32)       # (n,)
        # Force each object's best anchor; with duplicated anchors keep the last object.
        order = tf.range(num_gt)
        keep_last = tf.math.unsorted_segment_max(order, best_anchor, num_anchors)  # (A,)
        forced = keep_last >= 0
        best_gt = tf.where(forced, keep_last, best_gt)
        best_iou = tf.where(forced, 2.0, best_iou)
        labels = tf.gather(gt_labels, best_gt)
        labels = tf.where(best_iou < config.iou_threshold, 0, labels)
        matched = corner_to_center(tf.gather(gt_boxes, best_gt))
        locations = encode_boxes(matched, anchors, config.center_variance, config.size_variance)
        locations = tf.where(labels[:, None] > 0, locations, 0.0)
        return tf.cast(locations, tf.float32), labels

    return tf.cond(num_gt > 0, assign, empty)


# --------------------------------------------------------------------------------------
# Model


def _sep_conv(x, filters: int, name: str, *, strides: int = 1, use_bias: bool = False,
              norm_act: bool = True, activation: str = "relu"):
    """ml-cvnets `SeparableConv2d`: depthwise 3x3 (no bias) + BN, then 1x1 (+ BN + act)."""
    if strides == 2:
        x = keras.layers.ZeroPadding2D(1, name=f"{name}_pad")(x)
    x = keras.layers.DepthwiseConv2D(
        3, strides=strides, padding="valid" if strides == 2 else "same", use_bias=False,
        depthwise_initializer="glorot_uniform", name=f"{name}_dw",
    )(x)
    x = batch_norm(f"{name}_dw_bn")(x)
    x = keras.layers.Conv2D(
        filters, 1, use_bias=use_bias, kernel_initializer="glorot_uniform", name=f"{name}_pw"
    )(x)
    if norm_act:
        x = batch_norm(f"{name}_pw_bn")(x)
        x = keras.layers.Activation(activation, name=f"{name}_act")(x)
    return x


def SSDLite(  # noqa: N802 (keras.applications naming)
    width_multiplier: float = 1.0,
    input_shape: tuple[int, int, int] | None = (320, 320, 3),
    classes: int = 81,
    *,
    anchor_config: AnchorConfig | None = None,
    proj_channels: Sequence[int] = (512, 256, 256, 128, 128, 64),
    head_activation: str = "relu",
    attention="separable",
    weights: str | os.PathLike | None = None,
    backbone_weights: str | os.PathLike | keras.Model | None = None,
    input_tensor=None,
    name: str | None = None,
) -> keras.Model:
    """SSDLite (Sandler et al., 2018) on a MobileViTv2 backbone, as in the paper's Table 4.

    Prediction maps: `stage3_block1` (stride 16) and `stage4_block1` (stride 32) of the
    backbone, then extra stride-2 separable convs (3x3 depthwise + BN, 1x1 + BN + ReLU)
    for strides 64, 128, 256, and a global average pooling + 1x1 conv + ReLU (stride
    -1). Each map has an SSD head: an optional 1x1 conv + BN + ReLU projection to its
    `proj_channels` (when they differ from the map's), then a separable 3x3 conv
    (1x1 for the global map) to `anchors x (4 + classes)` outputs with bias.

    Args:
        width_multiplier: backbone width.
        input_shape: `(height, width, 3)`; defaults to 320x320 (Table 4). Height and
            width may be `None`: one model for any size, whose anchors (one set per
            image size) come from `anchors_for_model(model, image_size=...)`.
        classes: classes including the background (COCO: 81).
        anchor_config: `AnchorConfig` (defaults to the paper's COCO settings). Strides 16
            and 32 come from the backbone, larger ones from extra layers.
        proj_channels: per prediction map, the head's projection width (and the
            output width of the extra layers).
        head_activation: activation of the extra layers and projections (ReLU).
        attention: attention of the backbone (any of `keras_mvit2.attention`).
        weights: a `.weights.h5` of this very model.
        backbone_weights: a classifier checkpoint for the backbone, or a model with
            the same backbone to copy it from (see `tasks.load_backbone_weights`).
        input_tensor: optional Keras tensor to build on.
        name: model name.

    Returns:
        A Functional `keras.Model` mapping images in [0, 1] to raw predictions
        `(batch, num_anchors, 4 + classes)`; `model.anchors` holds the `(num_anchors, 4)`
        anchors (`None` for a model built for any size) and `model.anchor_config` their
        `AnchorConfig`.
    """
    _check_classes(classes, "background included, e.g. 81 for COCO")
    config = anchor_config or AnchorConfig()
    strides = list(config.output_strides)
    proj_channels = list(proj_channels) + [128] * (len(strides) - len(proj_channels))
    if name is None:
        name = f"ssdlite_mobilevitv2_{round(width_multiplier * 100):03d}"
    backbone = mobilevitv2_features(
        width_multiplier,
        input_shape=input_shape,
        output_stride=32,
        weights=backbone_weights,
        input_tensor=input_tensor,
        levels=("stage2", "stage3", "stage4"),
        attention=attention,
        name=f"{name}_backbone",
    )
    features = {8: "stage2", 16: "stage3", 32: "stage4"}
    maps = []
    previous = None
    for i, stride in enumerate(strides):
        if stride in features:
            x = backbone.output[features[stride]]
        elif stride == -1:
            if previous is None:
                raise ValueError("The global map (-1) needs a previous level.")
            x = keras.layers.GlobalAveragePooling2D(keepdims=True, name="extra_global_pool")(
                previous
            )
            x = keras.layers.Conv2D(
                proj_channels[i], 1, use_bias=False, kernel_initializer="glorot_uniform",
                name="extra_global_conv",
            )(x)
            x = keras.layers.Activation(head_activation, name="extra_global_act")(x)
        else:
            if previous is None or stride <= 32:
                raise ValueError(
                    f"Output stride {stride} is not available: the backbone gives 8, 16 and "
                    "32, extra layers double the previous stride."
                )
            x = _sep_conv(previous, proj_channels[i], f"extra_os{stride}", strides=2,
                          activation=head_activation)
        maps.append(x)
        previous = x

    num_anchors = config.num_anchors_per_location()
    outputs = []
    for i, (x, stride, k) in enumerate(zip(maps, strides, num_anchors, strict=True)):
        tag = "global" if stride == -1 else f"os{stride}"
        in_channels = int(x.shape[-1])
        per_anchor = 4 + classes
        if stride == -1:
            y = keras.layers.Conv2D(
                k * per_anchor, 1, use_bias=True, kernel_initializer="glorot_uniform",
                name=f"head_{tag}_pred",
            )(x)
        else:
            if proj_channels[i] != in_channels:
                y = keras.layers.Conv2D(
                    proj_channels[i], 1, use_bias=False, kernel_initializer="glorot_uniform",
                    name=f"head_{tag}_proj_conv",
                )(x)
                y = batch_norm(f"head_{tag}_proj_bn")(y)
                x = keras.layers.Activation(head_activation, name=f"head_{tag}_proj_act")(y)
            y = _sep_conv(x, k * per_anchor, f"head_{tag}_pred", use_bias=True, norm_act=False)
        height, width = y.shape[1], y.shape[2]
        # A model built for any input size has as many anchors as its maps have cells.
        locations = -1 if height is None or width is None else int(height) * int(width) * k
        outputs.append(
            keras.layers.Reshape((locations, per_anchor), name=f"head_{tag}_reshape")(y)
        )
    predictions = keras.layers.Concatenate(axis=1, name="ssd_predictions")(outputs)
    model = keras.Model(backbone.input, predictions, name=name)
    model.anchor_config = config
    if any(m.shape[1] is None or m.shape[2] is None for m in maps):
        model.anchors = model.feature_sizes = None  # per size: anchors_for_model(image_size=)
    else:
        sizes = [(int(m.shape[1]), int(m.shape[2])) for m in maps]
        model.anchors = ssd_anchors(sizes, config)
        model.feature_sizes = sizes
        if model.anchors.shape[0] != predictions.shape[1]:  # pragma: no cover - internal
            raise RuntimeError("anchor count does not match the head outputs")
    return _load_model_weights(model, weights)


def anchors_for_model(model: keras.Model, config: AnchorConfig | None = None,
                      image_size: int | tuple[int, int] | None = None) -> np.ndarray:
    """The anchors of an `SSDLite` model, also after a `.keras` reload.

    The prediction-map sizes are read from the `head_*_reshape` layers (in the order
    of the `ssd_predictions` concatenation); `config` must be the model's anchor
    settings (default: `AnchorConfig()`, or `model.anchor_config` when present).
    A model built for any input size (`input_shape=(None, None, 3)`) has anchors per
    image size: pass `image_size` (an int or `(height, width)`).
    """
    config = config or getattr(model, "anchor_config", None) or AnchorConfig()
    if has_dynamic_size(model) or image_size is not None:
        if image_size is None:
            raise ValueError(
                f"Model {model.name!r} was built for any input size; its anchors depend on "
                "the image size: pass image_size=(height, width)."
            )
        model = with_input_size(model, image_size)
    try:
        concat = model.get_layer("ssd_predictions")
    except ValueError:
        raise ValueError(
            f"Model {model.name!r} has no 'ssd_predictions' layer; it is not an SSDLite model."
        ) from None
    sizes = []
    for tensor in concat.input:
        reshape = tensor._keras_history.operation
        if not reshape.name.endswith("_reshape"):
            raise ValueError(f"Unexpected layer {reshape.name!r} before 'ssd_predictions'.")
        shape = reshape.input.shape
        sizes.append((int(shape[1]), int(shape[2])))
    anchors = ssd_anchors(sizes, config)
    if anchors.shape[0] != model.output_shape[1]:
        raise ValueError(
            f"The anchor settings give {anchors.shape[0]} anchors but the model predicts "
            f"{model.output_shape[1]}: pass the AnchorConfig the model was built with."
        )
    return anchors


# --------------------------------------------------------------------------------------
# Loss


def hard_negative_mask(background_loss, labels, neg_pos_ratio: int = 3):
    """ml-cvnets/qfgaohao `hard_negative_mining`: positives plus the hardest negatives.

    Per image, with `p` positive anchors, the `neg_pos_ratio * p` negative anchors of
    largest background loss (`-log softmax(...)[0]`) are kept (all negatives when
    there are fewer). Ties are broken by anchor index (stable sort).

    Args:
        background_loss: `(batch, A)` background cross-entropy of each anchor.
        labels: `(batch, A)` int labels (0 = background).
        neg_pos_ratio: negatives per positive.

    Returns:
        `(batch, A)` boolean mask of the anchors that enter the classification loss.
    """
    labels = ops.convert_to_tensor(labels)
    background_loss = ops.convert_to_tensor(background_loss)
    positive = labels > 0
    num_pos = ops.sum(ops.cast(positive, "int32"), axis=1, keepdims=True)
    num_neg = num_pos * neg_pos_ratio
    loss = ops.where(positive, ops.full_like(background_loss, -np.inf), background_loss)
    order = backend_forms.argsort_stable(loss, axis=1, descending=True)
    rank = backend_forms.argsort_stable(order, axis=1)
    negative = rank < num_neg
    return ops.logical_or(positive, negative)


@serializable
class SSDLoss(keras.losses.Loss):
    """SSD multibox loss: smooth-L1 on the positive anchors' offsets + softmax
    cross-entropy on the positives and the mined hard negatives, both summed and
    divided by the number of positives in the batch (ml-cvnets `SSDLoss`).

    Inputs:
        `y_true`: `(batch, A, 5)`: the 4 regression targets of `match_anchors`, then
            the label (as float).
        `y_pred`: `(batch, A, 4 + classes)` raw model output.

    Args:
        neg_pos_ratio: hard negatives per positive (3).
        label_smoothing: label smoothing of the classification loss (0).
    """

    def __init__(self, neg_pos_ratio: int = 3, label_smoothing: float = 0.0,
                 name: str = "ssd_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        if neg_pos_ratio < 1:
            raise ValueError(f"neg_pos_ratio must be >= 1. Received: {neg_pos_ratio}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1). Received: {label_smoothing}")
        self.neg_pos_ratio = int(neg_pos_ratio)
        self.label_smoothing = float(label_smoothing)

    def components(self, y_true, y_pred):
        """`(total, box_loss, class_loss)` as scalars (all divided by the positives)."""
        y_true = ops.convert_to_tensor(y_true)
        y_pred = ops.convert_to_tensor(y_pred)
        gt_locations = ops.cast(y_true[..., :4], y_pred.dtype)
        labels = ops.cast(ops.round(y_true[..., 4]), "int32")
        locations, logits = y_pred[..., :4], y_pred[..., 4:]
        classes = logits.shape[-1]
        positive = labels > 0
        pos = ops.cast(positive, y_pred.dtype)
        num_pos = ops.maximum(ops.sum(pos), 1.0)

        diff = ops.abs(locations - gt_locations)
        smooth_l1 = ops.where(diff < 1.0, 0.5 * diff * diff, diff - 0.5)
        box_loss = ops.sum(ops.sum(smooth_l1, axis=-1) * pos)

        log_probs = ops.log_softmax(logits, axis=-1)
        background_loss = ops.stop_gradient(-log_probs[..., 0])
        mask = ops.cast(hard_negative_mask(background_loss, labels, self.neg_pos_ratio),
                        y_pred.dtype)
        one_hot = ops.one_hot(labels, classes, dtype=y_pred.dtype)
        if self.label_smoothing:
            one_hot = one_hot * (1.0 - self.label_smoothing) + self.label_smoothing / classes
        ce = -ops.sum(one_hot * log_probs, axis=-1)
        class_loss = ops.sum(ce * mask)
        return (box_loss + class_loss) / num_pos, box_loss / num_pos, class_loss / num_pos

    def call(self, y_true, y_pred):
        return self.components(y_true, y_pred)[0]

    def get_config(self):
        return {**super().get_config(), "neg_pos_ratio": self.neg_pos_ratio,
                "label_smoothing": self.label_smoothing}


# --------------------------------------------------------------------------------------
# Post-processing (outside the graph)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float = 0.5) -> np.ndarray:
    """Greedy non-maximum suppression; indices kept, by decreasing score.

    A box is dropped when its IoU with a kept, higher-scoring box is strictly above
    `iou_threshold` (torchvision's rule). Equal scores keep the lower index first.
    """
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    scores = np.asarray(scores, np.float64).reshape(-1)
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    suppressed = np.zeros(len(order), dtype=bool)
    ious = iou_matrix(boxes, boxes) if len(boxes) else np.zeros((0, 0))
    for pos, i in enumerate(order):
        if suppressed[pos]:
            continue
        keep.append(int(i))
        later = order[pos + 1:]
        suppressed[pos + 1:] |= ious[i, later] > iou_threshold
    return np.asarray(keep, dtype=np.int64)


@dataclass
class Detections:
    """Detections of one image: corner boxes (normalized), class ids (>= 1), scores."""

    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))
    classes: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.int64))
    scores: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.float32))

    def __len__(self) -> int:
        return len(self.scores)


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def postprocess_detections(
    predictions: np.ndarray,
    anchors: np.ndarray,
    config: AnchorConfig = AnchorConfig(),
    *,
    score_threshold: float = 0.01,
    iou_threshold: float = 0.5,
    top_k: int = 400,
    max_detections: int = 200,
) -> list[Detections]:
    """Decodes SSD predictions and runs per-class NMS (ml-cvnets `postprocess_detections`).

    For each object class: softmax score above `score_threshold`, the `top_k` best,
    then NMS across classes done class by class (`batched_nms`), and the
    `max_detections` best overall. Runs in numpy: the same function serves Keras,
    TFLite and Core ML outputs.

    Args:
        predictions: `(batch, A, 4 + classes)` raw model outputs.
        anchors: `(A, 4)` anchors (`model.anchors`).
        config: variances.

    Returns:
        One `Detections` per image (boxes clipped to [0, 1]).
    """
    predictions = np.asarray(predictions, np.float32)
    if predictions.ndim != 3 or predictions.shape[1] != len(anchors):
        raise ValueError(
            f"predictions must be (batch, {len(anchors)}, 4 + classes). "
            f"Received: {predictions.shape}"
        )
    boxes = center_to_corner(
        decode_boxes(predictions[..., :4], anchors[None], config.center_variance,
                     config.size_variance)
    )
    boxes = np.clip(boxes, 0.0, 1.0)
    scores = _softmax(predictions[..., 4:])
    results = []
    for b in range(predictions.shape[0]):
        all_boxes, all_scores, all_classes = [], [], []
        for c in range(1, scores.shape[-1]):
            s = scores[b, :, c]
            idx = np.nonzero(s > score_threshold)[0]
            if not len(idx):
                continue
            idx = idx[np.argsort(-s[idx], kind="stable")[:top_k]]
            all_boxes.append(boxes[b, idx])
            all_scores.append(s[idx])
            all_classes.append(np.full(len(idx), c, np.int64))
        if not all_scores:
            results.append(Detections())
            continue
        cat_boxes = np.concatenate(all_boxes)
        cat_scores = np.concatenate(all_scores)
        cat_classes = np.concatenate(all_classes)
        keep = []
        for c in np.unique(cat_classes):
            members = np.nonzero(cat_classes == c)[0]
            keep.extend(members[nms(cat_boxes[members], cat_scores[members], iou_threshold)])
        keep = np.asarray(keep, np.int64)
        keep = keep[np.argsort(-cat_scores[keep], kind="stable")][:max_detections]
        results.append(Detections(cat_boxes[keep].astype(np.float32), cat_classes[keep],
                                  cat_scores[keep].astype(np.float32)))
    return results


# --------------------------------------------------------------------------------------
# COCO mAP (pycocotools)


def coco_map(
    ground_truth: Sequence[tuple[np.ndarray, np.ndarray]],
    detections: Sequence[Detections],
    image_size: tuple[int, int] = (1, 1),
    *,
    category_ids: Sequence[int] | None = None,
) -> dict[str, float]:
    """COCO box mAP with pycocotools (`COCOeval(iouType="bbox")`).

    Args:
        ground_truth: per image `(boxes (n, 4) corner normalized, labels (n,) >= 1)`.
        detections: per image `Detections`.
        image_size: `(height, width)` in pixels used to scale the normalized boxes
            (COCO's small/medium/large areas are in pixels; mAP@[.5:.95] does not
            depend on the scale).
        category_ids: the classes to evaluate (default: every label in the ground truth).

    Returns:
        `{"map": AP@[.5:.95], "map_50": AP@.5, "map_75": AP@.75, "map_small",
        "map_medium", "map_large", "mar_100": AR@100}`; -1 where COCO has no object of
        that kind (pycocotools' convention). No detections at all gives 0.0 mAP.

    Raises:
        ImportError: pycocotools is missing (`pip install 'keras_mvit2[detection]'`).
    """
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "COCO mAP needs pycocotools: pip install pycocotools (or the "
            "keras_mvit2 'detection' extra)."
        ) from err
    if len(ground_truth) != len(detections):
        raise ValueError(
            f"ground_truth has {len(ground_truth)} images, detections {len(detections)}."
        )
    height, width = image_size
    scale = np.array([width, height, width, height], np.float64)
    images, annotations, results = [], [], []
    labels_seen: set[int] = set()
    for image_id, ((gt_boxes, gt_labels), det) in enumerate(
        zip(ground_truth, detections, strict=True), start=1
    ):
        images.append({"id": image_id, "height": height, "width": width})
        for box, label in zip(np.asarray(gt_boxes).reshape(-1, 4),
                              np.asarray(gt_labels).reshape(-1), strict=True):
            x1, y1, x2, y2 = (np.asarray(box, np.float64) * scale).tolist()
            w, h = max(x2 - x1, 0.0), max(y2 - y1, 0.0)
            annotations.append({
                "id": len(annotations) + 1, "image_id": image_id, "category_id": int(label),
                "bbox": [x1, y1, w, h], "area": w * h, "iscrowd": 0,
            })
            labels_seen.add(int(label))
        for box, label, score in zip(det.boxes, det.classes, det.scores, strict=True):
            x1, y1, x2, y2 = (np.asarray(box, np.float64) * scale).tolist()
            results.append({"image_id": image_id, "category_id": int(label),
                            "bbox": [x1, y1, max(x2 - x1, 0.0), max(y2 - y1, 0.0)],
                            "score": float(score)})
    cats = sorted(labels_seen if category_ids is None else {int(c) for c in category_ids})
    keys = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large")
    if not results or not annotations:
        return {**dict.fromkeys(keys, 0.0), "mar_100": 0.0}
    gt = COCO()
    gt.dataset = {"images": images, "annotations": annotations,
                  "categories": [{"id": c, "name": str(c)} for c in cats]}
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        dt = gt.loadRes(results)
        evaluator = COCOeval(gt, dt, iouType="bbox")
        evaluator.params.catIds = cats
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = evaluator.stats
    out = {k: float(stats[i]) for i, k in enumerate(keys)}
    out["mar_100"] = float(stats[8])
    return out
