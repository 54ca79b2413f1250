"""Semantic segmentation on MobileViTv2: DeepLabv3 (ASPP) and PSPNet (pyramid pooling),
pixel cross-entropy with an ignore index, and confusion-matrix mIoU.

The heads follow ml-cvnets (`cvnets/models/segmentation/heads/{deeplabv3,pspnet}.py`,
`cvnets/modules/{aspp_block,pspnet_module}.py`) with the paper's ADE20k settings
(`config/segmentation/ade20k/*_mobilevitv2.yaml`): output stride 8, 512 head
channels, ASPP rates (12, 24, 36), PSP pool sizes (1, 2, 3, 6), dropout 0.1, ReLU in
the head (the backbone keeps SiLU), logits upsampled to the input size (bilinear,
align_corners=True). The auxiliary training head of those configs is not built (the
parameter counts of the paper's Table 3 do not include it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import keras
import numpy as np
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.backend import forms as backend_forms
from keras_mvit2.layers.inverted_residual import batch_norm
from keras_mvit2.layers.patching import resize_if_needed, spatial_size
from keras_mvit2.models.mobilevitv2.mobilevitv2_features import mobilevitv2_features

__all__ = [
    "AdaptiveAveragePooling2D",
    "AtrousConv2D",
    "BilinearResize",
    "DeepLabV3",
    "PSPNet",
    "SegmentationCrossEntropy",
    "SegmentationMeanIoU",
    "confusion_matrix",
    "iou_from_confusion",
    "mean_iou",
]


# --------------------------------------------------------------------------------------
# Layers


@serializable
class BilinearResize(keras.layers.Layer):
    """Bilinear resize to a fixed `(height, width)`, or to the size of a second input.

    `align_corners=True` is PyTorch's `F.interpolate(..., align_corners=True)` (used by
    ml-cvnets for the segmentation output and the PSP branches); TFLite's
    RESIZE_BILINEAR and Core ML support both modes.

    With `size=None` the layer is called on `[x, reference]` and resizes `x` to the
    height and width of `reference`, read at each call (static when the reference's
    size is, at run time otherwise): the form used by models built for any input
    size. A call that needs no resize adds no op.
    """

    def __init__(self, size: Sequence[int] | None, align_corners: bool = True, **kwargs):
        super().__init__(**kwargs)
        if size is not None:
            size = tuple(int(s) for s in size)
            if len(size) != 2 or min(size) < 1:
                raise ValueError(f"size must be (height, width) >= 1. Received: size={size}")
        self.size = size
        self.align_corners = bool(align_corners)

    def _resize(self, x, size):
        return backend_forms.resize_bilinear(x, size, align_corners=self.align_corners)

    def call(self, inputs):
        if self.size is None:
            if not isinstance(inputs, list | tuple) or len(inputs) != 2:
                raise ValueError(
                    "BilinearResize(size=None) is called on [x, reference]. "
                    f"Received: {type(inputs).__name__}"
                )
            x, reference = inputs
            return resize_if_needed(x, spatial_size(reference), self._resize)
        if tuple(inputs.shape[1:3]) == self.size:
            return inputs
        return self._resize(inputs, self.size)

    def compute_output_shape(self, input_shape):
        if self.size is None:
            x_shape, reference_shape = input_shape
            return (x_shape[0], *reference_shape[1:3], x_shape[-1])
        return (input_shape[0], *self.size, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "size": self.size, "align_corners": self.align_corners}


@serializable
class AdaptiveAveragePooling2D(keras.layers.Layer):
    """PyTorch's `AdaptiveAvgPool2d(output_size)`.

    Bin `i` of an axis of size `n` covers `[floor(i n / s), ceil((i + 1) n / s))`.
    When `n` is a multiple of `s` this is a plain average pooling; otherwise every bin
    is a slice and a mean (STRIDED_SLICE + MEAN in TFLite, no custom op). With an
    unknown height or width (a model built for any size) the bins are computed from
    the runtime size, each a slice and a mean.
    """

    def __init__(self, output_size: int | Sequence[int], **kwargs):
        super().__init__(**kwargs)
        if isinstance(output_size, int):
            output_size = (output_size, output_size)
        output_size = tuple(int(s) for s in output_size)
        if len(output_size) != 2 or min(output_size) < 1:
            raise ValueError(f"output_size must be >= 1. Received: output_size={output_size}")
        self.output_size = output_size

    @staticmethod
    def bins(size: int, bins: int) -> list[tuple[int, int]]:
        return [
            (math.floor(i * size / bins), math.ceil((i + 1) * size / bins)) for i in range(bins)
        ]

    @staticmethod
    def runtime_bins(size, bins: int) -> list[tuple]:
        """`bins` for a size that may be a scalar tensor (same integer arithmetic)."""
        return [((i * size) // bins, -((-(i + 1) * size) // bins)) for i in range(bins)]

    def call(self, inputs):
        height, width = inputs.shape[1], inputs.shape[2]
        oh, ow = self.output_size
        bins = self.bins
        if height is None or width is None:  # a model built for any input size
            if (oh, ow) == (1, 1):
                return ops.mean(inputs, axis=(1, 2), keepdims=True)
            height, width = spatial_size(inputs)
            bins = self.runtime_bins
        elif height % oh == 0 and width % ow == 0:
            ph, pw = height // oh, width // ow
            if (ph, pw) == (1, 1):
                return inputs
            if (oh, ow) == (1, 1):
                return ops.mean(inputs, axis=(1, 2), keepdims=True)
            return ops.average_pool(inputs, (ph, pw), strides=(ph, pw), padding="valid")
        rows = []
        for h0, h1 in bins(height, oh):
            cols = [
                ops.mean(inputs[:, h0:h1, w0:w1, :], axis=(1, 2), keepdims=True)
                for w0, w1 in bins(width, ow)
            ]
            rows.append(ops.concatenate(cols, axis=2) if len(cols) > 1 else cols[0])
        return ops.concatenate(rows, axis=1) if len(rows) > 1 else rows[0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], *self.output_size, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "output_size": self.output_size}


@serializable
class AtrousConv2D(keras.layers.Conv2D):
    """3x3 "same" convolution with dilation `rate` and no bias (an ASPP branch).

    When the rate reaches past the feature map (`rate >= height` and `rate >= width`)
    every tap but the center one reads zero padding, so the layer computes the exact
    same output as a 1x1 convolution with the center tap of its 3x3 kernel, and does
    that: TensorFlow would otherwise pad the map to a multiple of the rate (a rate-36
    branch on an 8x8 map costs 20x its useful MACs), and TFLite could not fuse the
    space-to-batch ops of equal clipped rates. The kernel stays 3x3 (checkpoints and
    `get_config` are unchanged).
    """

    def __init__(self, filters: int, rate: int, **kwargs):
        kwargs.setdefault("kernel_initializer", "he_uniform")
        for key in ("kernel_size", "padding", "dilation_rate", "use_bias", "strides"):
            kwargs.pop(key, None)
        super().__init__(filters, 3, padding="same", dilation_rate=rate, use_bias=False,
                         **kwargs)
        self.rate = int(rate)
        self.center_only = False

    def build(self, input_shape):
        super().build(input_shape)
        height, width = input_shape[1], input_shape[2]
        self.center_only = (height is not None and width is not None
                            and self.rate >= height and self.rate >= width)

    def convolution_op(self, inputs, kernel):
        if self.center_only:
            return ops.conv(inputs, kernel[1:2, 1:2], strides=1, padding="valid")
        return super().convolution_op(inputs, kernel)

    def get_config(self):
        config = super().get_config()
        for key in ("kernel_size", "padding", "dilation_rate", "use_bias", "strides",
                    "groups", "data_format"):
            config.pop(key, None)
        return {**config, "rate": self.rate}


def _resize_like(x, reference, *, align_corners: bool, name: str):
    """`x` resized to the spatial size of `reference`: a fixed size when the model has
    one (the graph of a fixed-size model), else read from `reference` at each call."""
    size = tuple(reference.shape[1:3])
    if None in size:
        return BilinearResize(None, align_corners=align_corners, name=name)([x, reference])
    return BilinearResize(size, align_corners=align_corners, name=name)(x)


def _conv_bn_act(x, filters: int, kernel_size: int, name: str, *, dilation: int = 1,
                 activation: str = "relu"):
    """ml-cvnets `ConvLayer2d(use_norm=True, use_act=True)`: conv (no bias) + BN + act."""
    x = keras.layers.Conv2D(
        filters, kernel_size, padding="same", dilation_rate=dilation, use_bias=False,
        kernel_initializer="he_uniform", name=f"{name}_conv",
    )(x)
    x = batch_norm(f"{name}_bn")(x)
    return keras.layers.Activation(activation, name=f"{name}_act")(x)


def _classifier(x, classes: int, name: str = "seg_classifier"):
    return keras.layers.Conv2D(
        classes, 1, use_bias=True, kernel_initializer="he_uniform", name=name
    )(x)


def _check_classes(classes, note: str = "including the background class") -> None:
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 2:
        raise ValueError(f"classes must be an int >= 2 ({note}). Received: classes={classes!r}")


def _backbone(head: str, dropout: float, width_multiplier, input_shape, input_tensor,
              output_stride, backbone_weights, attention, name):
    """`(backbone, model name)` of a segmentation model, after checking `dropout`."""
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1). Received: dropout={dropout}")
    if name is None:
        name = f"{head}_mobilevitv2_{round(width_multiplier * 100):03d}"
    return mobilevitv2_features(
        width_multiplier,
        input_shape=(512, 512, 3) if input_shape is None and input_tensor is None
        else input_shape,
        output_stride=output_stride,
        weights=backbone_weights,
        input_tensor=input_tensor,
        levels=("stage4",),
        attention=attention,
        name=f"{name}_backbone",
    ), name


def _finish(backbone, logits, upsample: bool, name: str, weights) -> keras.Model:
    if upsample:
        logits = _resize_like(logits, backbone.input, align_corners=True, name="seg_upsample")
    return _load_model_weights(keras.Model(backbone.input, logits, name=name), weights)


def _load_model_weights(model: keras.Model, weights) -> keras.Model:
    """`model` with the `.weights.h5` file `weights` loaded (`None`: as it is)."""
    if weights is not None:
        weights = os.fspath(weights)
        if not os.path.exists(weights):
            raise FileNotFoundError(f"Weights file not found: {weights!r}")
        model.load_weights(weights)
    return model


def DeepLabV3(  # noqa: N802 (keras.applications naming)
    width_multiplier: float = 1.0,
    input_shape: tuple[int, int, int] | None = (512, 512, 3),
    classes: int = 21,
    *,
    output_stride: int = 8,
    aspp_channels: int = 512,
    aspp_rates: Sequence[int] | None = None,
    dropout: float = 0.1,
    head_activation: str = "relu",
    upsample_logits: bool = True,
    attention="separable",
    weights: str | os.PathLike | None = None,
    backbone_weights: str | os.PathLike | keras.Model | None = None,
    input_tensor=None,
    name: str | None = None,
) -> keras.Model:
    """DeepLabv3 (Chen et al., 2017) on a MobileViTv2 backbone, as in the paper's Table 3.

    ASPP on the last feature map: a 1x1 branch, three 3x3 branches dilated by
    `aspp_rates`, and an image-pooling branch (each conv + BN + ReLU, `aspp_channels`
    wide), concatenated and projected (1x1 + BN + ReLU), spatial dropout, then a 1x1
    classifier with bias.

    Args:
        width_multiplier: backbone width (alpha).
        input_shape: `(height, width, 3)`; height and width may be `None` (one model
            for any size). Defaults to 512x512 (Table 3).
        classes: number of classes, background included (ADE20k: 150, VOC: 21).
        output_stride: 8 (ADE20k config, default) or 16 (PASCAL VOC config) or 32.
        aspp_channels: ASPP width (ml-cvnets MobileViTv2 configs: 512).
        aspp_rates: three dilation rates; default (12, 24, 36) at output stride 8 and
            (6, 12, 18) at 16 (ml-cvnets configs), halved again at 32.
        dropout: spatial dropout after the ASPP projection (0.1).
        head_activation: activation of the head convs (ml-cvnets: ReLU).
        upsample_logits: resize the logits to the input size (bilinear,
            align_corners); `False` returns them at the output stride.
        attention: attention of the backbone blocks (any of `keras_mvit2.attention`).
        weights: a `.weights.h5` of this very model (same arguments).
        backbone_weights: a classifier checkpoint for the backbone, or a model with
            the same backbone to copy it from (see
            `keras_mvit2.tasks.load_backbone_weights`).
        input_tensor: optional Keras tensor to build on.
        name: model name.

    Returns:
        A Functional `keras.Model` mapping RGB images in [0, 1] to logits
        `(batch, H, W, classes)` (or `(batch, H / os, W / os, classes)`).
    """
    _check_classes(classes)
    if aspp_rates is None:
        aspp_rates = {8: (12, 24, 36), 16: (6, 12, 18), 32: (3, 6, 9)}.get(output_stride)
    aspp_rates = tuple(int(r) for r in (aspp_rates or ()))
    if len(aspp_rates) != 3 or min(aspp_rates) < 1:
        raise ValueError(f"aspp_rates must be 3 positive ints. Received: {aspp_rates}")
    backbone, name = _backbone("deeplabv3", dropout, width_multiplier, input_shape,
                               input_tensor, output_stride, backbone_weights, attention, name)
    x = backbone.output["stage4"]
    branches = [_conv_bn_act(x, aspp_channels, 1, "aspp_in", activation=head_activation)]
    for i, rate in enumerate(aspp_rates):
        y = AtrousConv2D(aspp_channels, rate, name=f"aspp_atrous{i}_conv")(x)
        y = batch_norm(f"aspp_atrous{i}_bn")(y)
        branches.append(keras.layers.Activation(head_activation, name=f"aspp_atrous{i}_act")(y))
    pooled = keras.layers.GlobalAveragePooling2D(keepdims=True, name="aspp_pool")(x)
    pooled = _conv_bn_act(pooled, aspp_channels, 1, "aspp_pool_proj", activation=head_activation)
    # ml-cvnets: F.interpolate(align_corners=False) of the 1x1 map, i.e. a broadcast.
    pooled = _resize_like(pooled, x, align_corners=False, name="aspp_pool_upsample")
    branches.append(pooled)
    y = keras.layers.Concatenate(name="aspp_concat")(branches)
    y = _conv_bn_act(y, aspp_channels, 1, "aspp_project", activation=head_activation)
    if dropout:
        y = keras.layers.SpatialDropout2D(dropout, name="aspp_dropout")(y)
    logits = _classifier(y, classes)
    return _finish(backbone, logits, upsample_logits, name, weights)


def PSPNet(  # noqa: N802 (keras.applications naming)
    width_multiplier: float = 1.0,
    input_shape: tuple[int, int, int] | None = (512, 512, 3),
    classes: int = 21,
    *,
    output_stride: int = 8,
    psp_channels: int = 512,
    pool_sizes: Sequence[int] = (1, 2, 3, 6),
    dropout: float = 0.1,
    head_activation: str = "relu",
    upsample_logits: bool = True,
    attention="separable",
    weights: str | os.PathLike | None = None,
    backbone_weights: str | os.PathLike | keras.Model | None = None,
    input_tensor=None,
    name: str | None = None,
) -> keras.Model:
    """PSPNet (Zhao et al., 2017) on a MobileViTv2 backbone, as in the paper's Table 3.

    Pyramid pooling on the last feature map (ml-cvnets `PSP`): for each pool size an
    adaptive average pooling and a 1x1 conv + BN + ReLU to `C / len(pool_sizes)`
    channels (floored to a multiple of 16), bilinearly upsampled (align_corners) and
    concatenated with the features; a 3x3 conv + BN + ReLU to `psp_channels`, spatial
    dropout, and a 1x1 classifier with bias. The arguments it shares with `DeepLabV3`
    (width, input, classes, output stride, head activation, logits upsampling,
    attention, weights, input tensor, name) mean the same there.

    Args:
        psp_channels: fusion width (ml-cvnets MobileViTv2 configs: 512).
        pool_sizes: adaptive pooling sizes (default (1, 2, 3, 6)).
        dropout: spatial dropout after the fusion conv (0.1).

    Returns:
        A Functional `keras.Model` from images in [0, 1] to logits.
    """
    _check_classes(classes)
    pool_sizes = tuple(int(p) for p in pool_sizes)
    if not pool_sizes or min(pool_sizes) < 1:
        raise ValueError(f"pool_sizes must be positive ints. Received: {pool_sizes}")
    backbone, name = _backbone("pspnet", dropout, width_multiplier, input_shape,
                               input_tensor, output_stride, backbone_weights, attention, name)
    x = backbone.output["stage4"]
    channels = int(x.shape[-1])
    reduction = (channels // len(pool_sizes)) // 16 * 16
    if reduction < 1:
        raise ValueError(
            f"The backbone has {channels} channels: too few for {len(pool_sizes)} pyramid "
            "branches of a multiple of 16 channels. Use fewer pool_sizes or a wider backbone."
        )
    branches = [x]
    for ps in pool_sizes:
        y = AdaptiveAveragePooling2D(ps, name=f"psp_pool{ps}")(x)
        y = _conv_bn_act(y, reduction, 1, f"psp_branch{ps}", activation=head_activation)
        y = _resize_like(y, x, align_corners=True, name=f"psp_upsample{ps}")
        branches.append(y)
    y = keras.layers.Concatenate(name="psp_concat")(branches)
    y = _conv_bn_act(y, psp_channels, 3, "psp_fusion", activation=head_activation)
    if dropout:
        y = keras.layers.SpatialDropout2D(dropout, name="psp_dropout")(y)
    logits = _classifier(y, classes)
    return _finish(backbone, logits, upsample_logits, name, weights)


# --------------------------------------------------------------------------------------
# Loss and metrics


@serializable
class SegmentationCrossEntropy(keras.losses.Loss):
    """Pixel-wise softmax cross-entropy that skips pixels labelled `ignore_index`.

    The loss is the mean over the pixels that are not ignored (PyTorch's
    `F.cross_entropy(..., ignore_index=i, reduction="mean")`, as ml-cvnets); a batch
    with no valid pixel gives 0. Logits at a lower resolution than the labels are
    resized to the label size first (bilinear, align_corners, as ml-cvnets).

    Args:
        ignore_index: label value to skip (255 for PASCAL VOC, -1 for ADE20k in
            ml-cvnets). Labels outside `[0, classes)` other than this are an error in
            eager mode and undefined inside a graph.
        from_logits: `y_pred` are logits (default). `False`: probabilities.
        label_smoothing: optional label smoothing.

    Inputs:
        `y_true`: integer labels `(batch, H, W)` (or `(batch, H, W, 1)`).
        `y_pred`: `(batch, h, w, classes)`.
    """

    def __init__(self, ignore_index: int = 255, from_logits: bool = True,
                 label_smoothing: float = 0.0, name: str = "segmentation_cross_entropy",
                 **kwargs):
        super().__init__(name=name, **kwargs)
        self.ignore_index = int(ignore_index)
        self.from_logits = bool(from_logits)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1). Received: {label_smoothing}")
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true, y_pred):
        y_true, y_pred = _align(y_true, y_pred)
        classes = y_pred.shape[-1]
        valid = ops.not_equal(y_true, self.ignore_index)
        labels = ops.where(valid, y_true, ops.zeros_like(y_true))
        one_hot = ops.one_hot(labels, classes, dtype=y_pred.dtype)
        if self.label_smoothing:
            one_hot = one_hot * (1.0 - self.label_smoothing) + self.label_smoothing / classes
        if self.from_logits:
            log_probs = ops.log_softmax(y_pred, axis=-1)
        else:
            log_probs = ops.log(ops.clip(y_pred, 1e-7, 1.0))
        pixel_loss = -ops.sum(one_hot * log_probs, axis=-1)
        weights = ops.cast(valid, pixel_loss.dtype)
        total = ops.sum(pixel_loss * weights)
        return total / ops.maximum(ops.sum(weights), 1.0)

    def get_config(self):
        return {
            **super().get_config(),
            "ignore_index": self.ignore_index,
            "from_logits": self.from_logits,
            "label_smoothing": self.label_smoothing,
        }


def _align(y_true, y_pred):
    """Integer labels (B, H, W) and predictions resized to (B, H, W, C)."""
    y_true = ops.convert_to_tensor(y_true)
    if len(y_true.shape) == 4:
        y_true = ops.squeeze(y_true, axis=-1)
    y_true = ops.cast(y_true, "int32")
    y_pred = ops.convert_to_tensor(y_pred)
    label_hw = tuple(y_true.shape[1:3])
    if None not in label_hw and tuple(y_pred.shape[1:3]) != label_hw:
        y_pred = backend_forms.resize_bilinear(y_pred, label_hw, align_corners=True)
    return y_true, y_pred


def confusion_matrix(
    y_true: np.ndarray, y_pred: np.ndarray, num_classes: int, ignore_index: int | None = 255
) -> np.ndarray:
    """`(num_classes, num_classes)` int64 counts: row = true class, column = predicted.

    Pixels labelled `ignore_index` are skipped. `y_pred` holds class ids (take the
    argmax of logits first).

    Example:
    >>> confusion_matrix(np.array([0, 1, 1, 255]), np.array([0, 1, 0, 1]), 2)
    array([[1, 0],
           [1, 1]])
    """
    y_true = np.asarray(y_true).reshape(-1).astype(np.int64)
    y_pred = np.asarray(y_pred).reshape(-1).astype(np.int64)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true and y_pred differ in size: {y_true.shape} vs {y_pred.shape}")
    keep = np.ones_like(y_true, dtype=bool) if ignore_index is None else y_true != ignore_index
    y_true, y_pred = y_true[keep], y_pred[keep]
    bad = (y_true < 0) | (y_true >= num_classes) | (y_pred < 0) | (y_pred >= num_classes)
    if bad.any():
        raise ValueError(
            f"Labels must be in [0, {num_classes}) or equal ignore_index={ignore_index}. "
            f"Found values {sorted(set(y_true[bad].tolist()) | set(y_pred[bad].tolist()))[:10]}"
        )
    return np.bincount(
        y_true * num_classes + y_pred, minlength=num_classes * num_classes
    ).reshape(num_classes, num_classes)


def iou_from_confusion(matrix: np.ndarray) -> np.ndarray:
    """Per-class IoU = TP / (TP + FP + FN); NaN for a class absent from labels and predictions."""
    matrix = np.asarray(matrix, dtype=np.float64)
    tp = np.diag(matrix)
    union = matrix.sum(axis=0) + matrix.sum(axis=1) - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, tp / union, np.nan)


def mean_iou(matrix: np.ndarray) -> float:
    """Mean IoU over the classes that occur (in the labels or the predictions)."""
    iou = iou_from_confusion(matrix)
    return float(np.nanmean(iou)) if np.isfinite(iou).any() else 0.0


@serializable
class SegmentationMeanIoU(keras.metrics.Metric):
    """Dataset-level mean IoU from an accumulated confusion matrix.

    Takes logits (or probabilities) `(batch, h, w, classes)` and integer labels; logits
    at a lower resolution are resized to the labels. The mean is over the classes
    that occur in the labels or the predictions (`mean_iou`); `ignore_index` pixels
    are skipped.
    """

    def __init__(self, num_classes: int, ignore_index: int = 255, name: str = "miou", **kwargs):
        super().__init__(name=name, **kwargs)
        _check_classes(num_classes)
        self.num_classes = int(num_classes)
        self.ignore_index = int(ignore_index)
        self.matrix = self.add_variable(
            shape=(num_classes, num_classes), initializer="zeros", dtype="float32",
            name="confusion_matrix",
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true, y_pred = _align(y_true, y_pred)
        pred = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        n = self.num_classes
        valid = ops.logical_and(
            ops.not_equal(y_true, self.ignore_index),
            ops.logical_and(y_true >= 0, y_true < n),
        )
        index = ops.where(valid, y_true * n + pred, n * n)
        counts = ops.bincount(ops.reshape(index, (-1,)), minlength=n * n + 1)
        counts = ops.cast(counts[: n * n], "float32")
        self.matrix.assign_add(ops.reshape(counts, (n, n)))

    def result(self):
        tp = ops.diagonal(self.matrix)
        union = ops.sum(self.matrix, axis=0) + ops.sum(self.matrix, axis=1) - tp
        present = ops.cast(union > 0, "float32")
        iou = tp / ops.maximum(union, 1.0)
        return ops.sum(iou * present) / ops.maximum(ops.sum(present), 1.0)

    def reset_state(self):
        self.matrix.assign(ops.zeros_like(self.matrix))

    def confusion(self) -> np.ndarray:
        """The accumulated confusion matrix as int64 numpy."""
        return np.asarray(self.matrix.numpy()).round().astype(np.int64)

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes,
                "ignore_index": self.ignore_index}
