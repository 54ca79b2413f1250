"""Multi-scale MobileViTv2 feature extractor (the backbone of the segmentation and
detection models), with ml-cvnets' dilation for output stride 16 or 8.

The layers are the classifier's (`stem_*`, `stage{i}_block{j}`, same names, same
variables), so a classifier checkpoint loads into the feature extractor and into
every task model built on it (`load_backbone_weights`).

Output stride (ml-cvnets `BaseImageEncoder` / `MobileViTv2._make_mit_layer`):

- 32: the classifier's strides;
- 16: stage 4 (cvnets `layer_5`) keeps the resolution: its inverted residual gets
  stride 1 (dilation 1) and the MobileViTv2 block's depthwise 3x3 gets dilation 2;
- 8: stage 3 (`layer_4`) too: inverted residual stride 1 (dilation 1), block
  dilation 2; then stage 4: inverted residual stride 1 with dilation 2, block
  dilation 4.

Only the depthwise 3x3 convolutions are dilated. The unfold/fold of the MobileViTv2
block keeps its 2x2 patches on the larger map (more tokens, same weights), as the
reference does.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping

import keras

from keras_mvit2.api_export import serializable
from keras_mvit2.layers.inverted_residual import InvertedResidual
from keras_mvit2.models.builder_utils import model_input
from keras_mvit2.models.mobilevitv2.mobilevitv2_block import MobileViTV2Block
from keras_mvit2.models.mobilevitv2.mobilevitv2_builders import (
    ATTENTION_LAYERS,
    mobilevitv2_stem,
    mobilevitv2_widths,
)
from keras_mvit2.utils.arguments import validate_positive_ints

__all__ = [
    "FEATURE_LEVELS",
    "OUTPUT_STRIDES",
    "DilatedInvertedResidual",
    "DilatedMobileViTV2Block",
    "feature_strides",
    "load_backbone_weights",
    "mobilevitv2_features",
]

#: Output strides the feature extractor supports.
OUTPUT_STRIDES = (8, 16, 32)
#: Feature names, shallow to deep (outputs of `stage{1..4}_block1`).
FEATURE_LEVELS = ("stage1", "stage2", "stage3", "stage4")


def feature_strides(output_stride: int = 32) -> dict[str, int]:
    """Stride of each feature level for an output stride.

    Example:
    >>> feature_strides(8)
    {'stage1': 4, 'stage2': 8, 'stage3': 8, 'stage4': 8}
    """
    _check_output_stride(output_stride)
    return {name: min(4 * 2**i, output_stride) for i, name in enumerate(FEATURE_LEVELS)}


def _check_output_stride(output_stride) -> None:
    if output_stride not in OUTPUT_STRIDES:
        raise ValueError(
            f"output_stride must be one of {OUTPUT_STRIDES} (8 and 16 dilate the last stages "
            f"as ml-cvnets does). Received: output_stride={output_stride!r}"
        )


def _dilate_depthwise(layer: keras.layers.DepthwiseConv2D, dilation: int) -> None:
    # The kernel does not depend on the dilation, so the reference's weights load
    # unchanged; the convolution reads `dilation_rate` at call time. Only stride-1
    # "same" convolutions are dilated (the output size does not change).
    if dilation == 1:
        return
    if tuple(layer.strides) != (1, 1) or layer.padding != "same":
        raise ValueError(
            f"Only stride-1 'same' depthwise convolutions can be dilated; {layer.name!r} has "
            f"strides={layer.strides}, padding={layer.padding!r}."
        )
    layer.dilation_rate = (dilation, dilation)


@serializable
class DilatedInvertedResidual(InvertedResidual):
    """`InvertedResidual` whose depthwise 3x3 is dilated (stride 1 only).

    Same variables (and names) as `InvertedResidual`, so checkpoints port unchanged.

    Args:
        filters, strides, expansion, norm_epsilon, kernel_initializer: as
            `InvertedResidual`.
        dilation: int >= 1. Dilation of the depthwise convolution; > 1 needs `strides=1`.
    """

    def __init__(self, filters: int, strides: int = 1, dilation: int = 1, **kwargs):
        super().__init__(filters, strides=strides, **kwargs)
        validate_positive_ints(dilation=dilation)
        if dilation > 1 and strides != 1:
            raise ValueError(
                f"A dilated inverted residual needs strides=1. Received: strides={strides}, "
                f"dilation={dilation}"
            )
        self.dilation = dilation

    def build(self, input_shape):
        super().build(input_shape)
        _dilate_depthwise(self.depthwise_conv, self.dilation)

    def get_config(self):
        return {**super().get_config(), "dilation": self.dilation}


@serializable
class DilatedMobileViTV2Block(MobileViTV2Block):
    """`MobileViTV2Block` whose local depthwise 3x3 is dilated (ml-cvnets `dilation=`).

    The transformer still unfolds 2x2 patches of the (larger) map. Same variables as
    `MobileViTV2Block`.

    Args:
        attention_dim, num_layers, ...: as `MobileViTV2Block`.
        dilation: int >= 1. Dilation of the local depthwise convolution.
    """

    def __init__(self, attention_dim: int, num_layers: int, dilation: int = 1, **kwargs):
        super().__init__(attention_dim, num_layers, **kwargs)
        validate_positive_ints(dilation=dilation)
        self.dilation = dilation

    def build(self, input_shape):
        super().build(input_shape)
        _dilate_depthwise(self.local_conv, self.dilation)

    def get_config(self):
        return {**super().get_config(), "dilation": self.dilation}


def mobilevitv2_features(
    width_multiplier: float = 1.0,
    input_shape: tuple[int, int, int] | None = None,
    output_stride: int = 32,
    weights: str | os.PathLike | keras.Model | None = None,
    input_tensor=None,
    levels: tuple[str, ...] = FEATURE_LEVELS,
    name: str | None = None,
    *,
    attention="separable",
    attn_dropout: float = 0.0,
    ffn_dropout: float = 0.0,
    block_dropout: float = 0.0,
) -> keras.Model:
    """MobileViTv2 backbone returning its multi-scale feature maps.

    Args:
        width_multiplier: alpha of the paper (any value in (0, 4]).
        input_shape: `(height, width, 3)`; height and width may be `None` (one model
            for any size, see `keras_mvit2.with_input_size`). Defaults to `(256, 256, 3)`.
        output_stride: 32 (classifier strides), 16 or 8 (dilated last stages, as
            ml-cvnets' segmentation models).
        weights: `None`, or a classifier checkpoint (ml-cvnets `.pt`, timm
            `.pth`/`.bin`/`.safetensors`, a state dict, or a Keras `.weights.h5` of a
            `MobileViTV2` classifier; the classifier head is dropped), or a model
            with the same backbone to copy it from. See `load_backbone_weights`.
        input_tensor: optional Keras tensor to build on.
        levels: which of `FEATURE_LEVELS` to output (outputs of `stage1_block1` ..
            `stage4_block1`; strides 4/8/16/32 at output stride 32, see
            `feature_strides`).
        name: model name; defaults to `mobilevitv2_<100 alpha>_features_os<output_stride>`.
        attention: the attention of every MobileViTv2 block (any name of
            `keras_mvit2.attention.available()`, a config dict or a layer).

    `attn_dropout`, `ffn_dropout` and `block_dropout` are as in `MobileViTV2`.

    Returns:
        A Functional `keras.Model` whose output is a dict `{level: feature map}`.

    Example:
    >>> f = mobilevitv2_features(0.5, input_shape=(128, 128, 3), output_stride=16)
    >>> {k: tuple(v.shape) for k, v in f.output.items()}["stage4"]
    (None, 8, 8, 256)
    """
    _check_output_stride(output_stride)
    levels = tuple(levels)
    unknown = [lv for lv in levels if lv not in FEATURE_LEVELS]
    if unknown or not levels or len(set(levels)) != len(levels):
        raise ValueError(
            f"levels must be distinct names of {FEATURE_LEVELS}. Received: levels={levels}"
        )
    widths = mobilevitv2_widths(width_multiplier)
    inputs, x = model_input(input_tensor, input_shape)

    x = mobilevitv2_stem(x, widths)
    outputs = {"stage1": x}

    # ml-cvnets: dilate layer_4 (our stage 3) for OS 8, layer_5 (stage 4) for OS 8 and 16.
    dilate = {3: output_stride == 8, 4: output_stride in (8, 16)}
    dilation = 1
    for i, num_layers in enumerate(ATTENTION_LAYERS):
        stage = i + 2
        previous = dilation
        strides = 2
        if dilate.get(stage, False):
            dilation *= 2
            strides = 1
        x = DilatedInvertedResidual(
            widths.stages[stage], strides=strides, dilation=previous,
            name=f"stage{stage}_block0",
        )(x)
        x = DilatedMobileViTV2Block(
            widths.attention_dims[i],
            num_layers,
            dilation=dilation,
            attention=attention,
            ffn_dim=widths.ffn_dims[i],
            attn_dropout=attn_dropout,
            dropout=block_dropout,
            ffn_dropout=ffn_dropout,
            name=f"stage{stage}_block1",
        )(x)
        outputs[f"stage{stage}"] = x

    if name is None:
        name = f"mobilevitv2_{round(width_multiplier * 100):03d}_features_os{output_stride}"
    model = keras.Model(inputs, {lv: outputs[lv] for lv in levels}, name=name)
    load_backbone_weights(model, weights, width_multiplier=width_multiplier, attention=attention)
    return model


def load_backbone_weights(
    model: keras.Model,
    weights: str | os.PathLike | Mapping | keras.Model | None,
    *,
    width_multiplier: float | None = None,
    attention="separable",
) -> None:
    """Loads classifier weights into the MobileViTv2 layers of `model`, in place.

    `model` is a feature extractor or a task model built on one (its layers named
    `stem_conv`, `stage{i}_block{j}`, ...). Accepted sources:

    - PyTorch checkpoints (ml-cvnets `.pt`, timm `.pth`/`.bin`/`.safetensors`, HF),
      or such a state dict (name -> array): every backbone tensor is checked, the
      classifier tensors are ignored (`keras_mvit2.load_torch_weights`);
    - a Keras `.weights.h5` saved from a `MobileViTV2` classifier (any number of
      classes, with or without top): it is loaded into a temporary
      `MobileViTV2(width_multiplier, include_top=False, attention=attention)` and
      copied layer by layer (names and shapes checked);
    - a Keras model with the same backbone, or its `.keras` file: a `MobileViTV2`
      classifier, a feature extractor or a task model (e.g. a trained segmenter's
      backbone to start a detector from), copied layer by layer (names and shapes
      checked).

    Args:
        model: the model to fill.
        weights: `None` (nothing to do), the checkpoint path, a state dict or a model.
        width_multiplier: the backbone's width (needed for `.weights.h5` files only;
            read from the model when `None`).
        attention: the backbone's attention (for `.weights.h5` files).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a checkpoint of this width / not a keras_mvit2 model.
    """
    if weights is None:
        return
    if isinstance(weights, Mapping):
        from keras_mvit2.models.torch_weights import load_torch_weights

        _backbone_layers(model)
        load_torch_weights(model, weights)
        return
    if isinstance(weights, keras.Model):
        _copy_backbone(_backbone_layers(model), weights, f"model {weights.name!r}")
        return
    if not isinstance(weights, str | os.PathLike):
        raise ValueError(
            "weights must be None, a checkpoint path, a state dict or a Keras model. "
            f"Received: weights={type(weights).__name__}"
        )
    path = os.fspath(weights)
    if path == "imagenet":
        raise ValueError(
            "Task backbones take published weights through a model: pass "
            "keras_mvit2.MobileViTV2(<width>, weights='imagenet', include_top=False) (or the "
            "path of a classifier checkpoint: ml-cvnets .pt, timm .pth/.safetensors, or a "
            "Keras .weights.h5)."
        )
    if not os.path.exists(path):
        raise FileNotFoundError(f"Weights file not found: {path!r}")
    layers = _backbone_layers(model)
    if path.endswith(".keras"):
        from keras_mvit2.utils.model_files import check_file_format

        try:
            check_file_format(path, what="it")  # not a Keras archive (Keras: "File not found")
            source = keras.saving.load_model(path, compile=False)
        except Exception as err:  # not a Keras archive, unknown layers, ...
            raise ValueError(f"Cannot load the Keras model {path!r}: {err}") from err
        _copy_backbone(layers, source, repr(path))
        return
    if path.endswith(".weights.h5"):
        if width_multiplier is None:
            width_multiplier = _infer_width(model)
        _copy_from_classifier_h5(layers, path, width_multiplier, attention)
        return
    from keras_mvit2.models.torch_weights import load_torch_weights

    load_torch_weights(model, path)


def _backbone_layers(model: keras.Model) -> list[keras.layers.Layer]:
    pattern = re.compile(r"stem_(conv|bn)|stage\d+_block\d+")
    layers = [layer for layer in model.layers if pattern.fullmatch(layer.name)]
    if not any(layer.name == "stem_conv" for layer in layers):
        raise ValueError(
            f"Model {model.name!r} has no MobileViTv2 backbone layers (no 'stem_conv'); "
            "build it with keras_mvit2.tasks (mobilevitv2_features, DeepLabV3, PSPNet, SSDLite)."
        )
    return layers


def _infer_width(model: keras.Model) -> float:
    """The width multiplier whose last stage has the model's `stage4_block0` filters."""
    try:
        filters = model.get_layer("stage4_block0").filters
    except ValueError:
        raise ValueError(
            f"Model {model.name!r} has no 'stage4_block0'; pass width_multiplier=."
        ) from None
    for step in range(1, 801):
        alpha = step / 200
        if mobilevitv2_widths(alpha).stages[4] == filters:
            return alpha
    raise ValueError(f"No width multiplier gives {filters} channels; pass width_multiplier=.")


def _copy_from_classifier_h5(
    layers: list[keras.layers.Layer], path: str, width_multiplier: float, attention
) -> None:
    from keras_mvit2.models.mobilevitv2.mobilevitv2_builders import MobileViTV2

    source = MobileViTV2(
        width_multiplier, include_top=False, input_shape=(64, 64, 3), attention=attention
    )
    try:
        with warnings.catch_warnings():
            # A classifier file also holds the head, which include_top=False skips:
            # Keras warns about the unmatched container; every backbone variable is then
            # copied below with its name and shape checked.
            warnings.filterwarnings("ignore", message="Skipping nested container")
            source.load_weights(path)
    except ValueError as err:
        raise ValueError(
            f"{path!r} is not a Keras weights file of a MobileViTV2 classifier with "
            f"width_multiplier={width_multiplier} and attention={attention!r}: {err}. "
            "(A task model's own .weights.h5 goes to its weights= argument instead.)"
        ) from err
    _copy_backbone(layers, source, repr(path))


def _copy_backbone(layers: list[keras.layers.Layer], source: keras.Model, origin: str) -> None:
    """Copies every variable of `layers` from the same-named layer of `source`, all
    names and shapes checked before anything is assigned."""
    pairs = []
    for layer in layers:
        try:
            src = source.get_layer(layer.name)
        except ValueError:
            raise ValueError(
                f"{origin} has no layer {layer.name!r}: not a MobileViTv2 backbone."
            ) from None
        if len(src.weights) != len(layer.weights):
            raise ValueError(
                f"Layer {layer.name!r} has {len(layer.weights)} variables, {origin}'s "
                f"{len(src.weights)}: not the same architecture."
            )
        for dst_var, src_var in zip(layer.weights, src.weights, strict=True):
            if tuple(dst_var.shape) != tuple(src_var.shape):
                raise ValueError(
                    f"{dst_var.path}: shape {tuple(dst_var.shape)} in the model, "
                    f"{tuple(src_var.shape)} in {origin}."
                )
            pairs.append((dst_var, src_var))
    for dst_var, src_var in pairs:
        dst_var.assign(src_var)
