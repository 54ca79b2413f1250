"""MobileViTv2 (Mehta & Rastegari, "Separable Self-attention for Mobile Vision
Transformers", TMLR 2023): Table 6 architecture with ml-cvnets' width rule."""

import functools
import numbers
import os
from dataclasses import dataclass

import keras
import numpy as np
from keras import ops

from keras_mvit2.layers.inverted_residual import InvertedResidual, make_divisible
from keras_mvit2.layers.transformer_layer import default_ffn_dim
from keras_mvit2.models.builder_utils import classifier_head, conv_stem, load_weights, model_input
from keras_mvit2.models.mobilevitv2.mobilevitv2_block import MobileViTV2Block
from keras_mvit2.models.mobilevitv2.mobilevitv2_port import load_torch_weights
from keras_mvit2.models.mobilevitv2.mobilevitv2_presets import (
    check_pretrained_config,
    is_weights_tag,
)
from keras_mvit2.models.registry import register_builder
from keras_mvit2.utils.arguments import validate_rates
from keras_mvit2.weights.download import download_weights, load_pretrained

#: Transformer layers per MobileViTv2 block in stages 2, 3, 4 (B in Table 6).
ATTENTION_LAYERS = (2, 4, 3)


@dataclass(frozen=True)
class MobileViTV2Widths:
    """Channel widths of one MobileViTv2, from ml-cvnets' `make_divisible` rule."""

    stem: int
    stages: tuple[int, int, int, int, int]
    attention_dims: tuple[int, int, int]
    ffn_dims: tuple[int, int, int]


def mobilevitv2_widths(width_multiplier: float) -> MobileViTV2Widths:
    """Channels for any width multiplier (ml-cvnets `config/mobilevit_v2.py`)."""
    if (
        isinstance(width_multiplier, bool)
        or not isinstance(width_multiplier, numbers.Real)
        or not 0.0 < width_multiplier <= 4.0
    ):
        raise ValueError(
            "width_multiplier must be a number in (0, 4]; the paper uses 0.5 to 2.0. "
            f"Received: width_multiplier={width_multiplier!r}"
        )
    a = width_multiplier
    stem = make_divisible(min(max(32 * a, 16), 64), 8, min_value=16)
    stages = (
        make_divisible(64 * a, 16),
        make_divisible(128 * a, 8),
        make_divisible(256 * a, 8),
        make_divisible(384 * a, 8),
        make_divisible(512 * a, 8),
    )
    attention_dims = tuple(make_divisible(c * a, 8) for c in (128, 192, 256))
    ffn_dims = tuple(default_ffn_dim(d) for d in attention_dims)
    return MobileViTV2Widths(stem, stages, attention_dims, ffn_dims)


def mobilevitv2_stem(x, widths: MobileViTV2Widths):
    """The layers before the first attention stage, on a Keras tensor `(B, H, W, 3)`:
    3x3 stride-2 conv + BN + SiLU, then `stage0_block0` .. `stage1_block1` (inverted
    residuals); returns the stride-4 map `(B, H/4, W/4, widths.stages[1])`. Shared by the
    classifier and the task backbone, so their layer names (and weights) match."""
    x = conv_stem(x, widths.stem)
    x = InvertedResidual(widths.stages[0], strides=1, name="stage0_block0")(x)
    x = InvertedResidual(widths.stages[1], strides=2, name="stage1_block0")(x)
    return InvertedResidual(widths.stages[1], strides=1, name="stage1_block1")(x)


def MobileViTV2(  # noqa: N802 (keras.applications naming)
    width_multiplier: float = 1.0,
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: tuple[int, int, int] | None = None,
    pooling: str | None = None,
    classes: int = 1000,
    classifier_activation: str | None = "softmax",
    dropout: float = 0.0,
    name: str | None = None,
    *,
    attention="separable",
    attn_dropout: float = 0.0,
    ffn_dropout: float = 0.0,
    block_dropout: float = 0.0,
    drop_path_rate: float = 0.0,
) -> keras.Model:
    """Builds a MobileViTv2 image classifier or backbone (channels-last).

    Args:
        width_multiplier: float. alpha of the paper; 0.5 to 2.0 are the published
            models, any value in (0, 4] builds (channels follow ml-cvnets' rule).
        include_top: bool. Add global average pooling and the Dense classifier.
        weights: `None` (random init), a published tag (`"imagenet"`,
            `"imagenet22k_ft_in1k"`, `"imagenet22k_ft_in1k_384"`, `"imagenet_384"`;
            see `keras_mvit2.list_weights()`), downloaded once and cached, or the
            path of a checkpoint: an Apple ml-cvnets `.pt`, a timm `.pth` / `.bin` /
            `.safetensors`, or a Keras `.weights.h5`. With a tag and
            `include_top=True`, `classes` must be 1000 and the input size the
            checkpoint's (256, or 384 for the `_384` tags; the default follows the
            tag); `include_top=False` takes any size.
        input_tensor: optional Keras tensor to use as the image input.
        input_shape: `(height, width, 3)`. Defaults to `(256, 256, 3)`
            (384 for the `_384` weights). Height and/or width may be `None`: one
            model for every size (the blocks take their patch grid from each batch;
            `with_input_size` gives the fixed-size graph for export; with a weights
            tag and `include_top=True` a fixed size must be the checkpoint's). The
            attentions that need a fixed token count (`"linformer"`) need fixed sides.
            Inputs are RGB in [0, 1] (see `preprocess_images` for the checkpoints'
            evaluation transform).
        pooling: `None`, `"avg"` or `"max"`: pooling of the features when
            `include_top=False`.
        classes: int. Number of classes of the classifier.
        classifier_activation: activation of the classifier; `None` gives logits.
        dropout: float. Dropout before the classifier (the reference uses 0).
        name: model name. Defaults to `mobilevitv2_<100 * width_multiplier>`.
        attention: the attention inside every MobileViTv2 block: `"separable"`
            (the paper) or any name of `keras_mvit2.attention.available()`, a
            config dict or a layer, e.g. `attention="mha"` for the paper's
            Table 1 comparison.
        attn_dropout: float. Dropout on the context scores (reference 0).
        ffn_dropout: float. Dropout inside the FFN (reference 0).
        block_dropout: float. Dropout on attention and FFN outputs (reference 0).
        drop_path_rate: float in [0, 1). Stochastic depth of the deepest
            transformer layer; the rate grows linearly from 0 over the 9
            transformer layers (2 + 4 + 3), as timm's `drop_path_rate`.
            Training only; the paper uses 0 on ImageNet-1k (Table 9).

    Returns:
        A `keras.Model` (Functional).

    Example:
    >>> model = keras_mvit2.MobileViTV2(0.75, input_shape=(256, 256, 3))
    >>> model.output_shape
    (None, 1000)
    """
    widths = mobilevitv2_widths(width_multiplier)
    resolved = None
    if is_weights_tag(weights):  # check everything, then download, before building
        entry, input_shape = check_pretrained_config(
            width_multiplier, weights, include_top=include_top, classes=classes,
            input_shape=input_shape, input_tensor=input_tensor, attention=attention)
        resolved = download_weights(entry)
    validate_rates(drop_path_rate=drop_path_rate)
    # timm's rule: rate of layer i = drop_path_rate * i / (L - 1), over all L layers.
    total_layers = sum(ATTENTION_LAYERS)
    rates = [float(r) for r in np.linspace(0.0, drop_path_rate, total_layers)]
    inputs, x = model_input(input_tensor, input_shape)

    x = mobilevitv2_stem(x, widths)
    for i, num_layers in enumerate(ATTENTION_LAYERS):
        stage = i + 2
        x = InvertedResidual(widths.stages[stage], strides=2, name=f"stage{stage}_block0")(x)
        x = MobileViTV2Block(
            widths.attention_dims[i],
            num_layers,
            attention=attention,
            ffn_dim=widths.ffn_dims[i],
            attn_dropout=attn_dropout,
            dropout=block_dropout,
            ffn_dropout=ffn_dropout,
            drop_path=rates[sum(ATTENTION_LAYERS[:i]):sum(ATTENTION_LAYERS[: i + 1])],
            name=f"stage{stage}_block1",
        )(x)

    outputs = classifier_head(
        x,
        include_top=include_top,
        pooling=pooling,
        classes=classes,
        classifier_activation=classifier_activation,
        dropout=dropout,
    )
    if name is None:
        name = f"mobilevitv2_{round(width_multiplier * 100):03d}"
    model = keras.Model(inputs, outputs, name=name)
    if resolved is None:
        load_weights(model, weights)
    else:
        # Where the weights came from (the download, or the cached .weights.h5), and the
        # checkpoint, whose evaluation transform preprocess_images uses.
        model._keras_mvit2_weights_file = load_pretrained(
            model, resolved, include_top, port=load_torch_weights)
        model._keras_mvit2_weights = resolved.entry
    return model


def preprocess_input(x):
    """Images in [0, 255] (RGB) to the model's input: RGB in [0, 1], as the reference.

    No mean/std normalization (ml-cvnets and timm use mean 0, std 1). Returns a
    float32 numpy array for numpy input, a tensor otherwise.
    """
    if isinstance(x, np.ndarray):
        return x.astype("float32") / 255.0
    return ops.cast(x, "float32") / 255.0


@functools.cache
def imagenet_classes() -> tuple[tuple[str, str], ...]:
    """The 1000 ImageNet-1k classes in training-index order: `(synset id, name)`."""
    # beside the builders of every family: keras_mvit2/models/imagenet_classes.tsv
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "imagenet_classes.tsv")
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if not line.startswith("#")]
    return tuple((synset, lemmas.split(",")[0]) for synset, lemmas in rows)


def decode_predictions(predictions, top: int = 5) -> list[list[tuple[str, str, float]]]:
    """ImageNet-1k predictions `(batch, 1000)` to `[(synset, name, score), ...]` per image.

    As `keras.applications.*.decode_predictions`, without a download: the class
    names ship with the package.
    """
    predictions = np.asarray(predictions)
    if predictions.ndim != 2 or predictions.shape[1] != 1000:
        raise ValueError(
            "decode_predictions expects ImageNet-1k predictions of shape (batch, 1000). "
            f"Received: shape={predictions.shape}"
        )
    classes = imagenet_classes()
    decoded = []
    for row in predictions:
        best = np.argsort(row)[::-1][:top]
        decoded.append([(*classes[i], float(row[i])) for i in best])
    return decoded


def _named_builder(width_multiplier: float, name: str):
    return register_builder(
        name, lambda **kwargs: MobileViTV2(width_multiplier=width_multiplier, **kwargs),
        f"MobileViTv2-{width_multiplier} (`MobileViTV2(width_multiplier={width_multiplier})`); "
        "keyword arguments as `MobileViTV2`.",
    )


mobilevitv2_050 = _named_builder(0.5, "mobilevitv2_050")
mobilevitv2_075 = _named_builder(0.75, "mobilevitv2_075")
mobilevitv2_100 = _named_builder(1.0, "mobilevitv2_100")
mobilevitv2_125 = _named_builder(1.25, "mobilevitv2_125")
mobilevitv2_150 = _named_builder(1.5, "mobilevitv2_150")
mobilevitv2_175 = _named_builder(1.75, "mobilevitv2_175")
mobilevitv2_200 = _named_builder(2.0, "mobilevitv2_200")
