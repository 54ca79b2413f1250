"""MobileViT v1 (Mehta & Rastegari, "MobileViT: Light-weight, General-purpose, and
Mobile-friendly Vision Transformer", ICLR 2022): XXS / XS / S as timm's
`mobilevit_xxs` / `mobilevit_xs` / `mobilevit_s`, the v1 baseline of the
MobileViTv2 paper's Fig. 2."""

from dataclasses import dataclass

import keras

from keras_mvit2.layers.initializers import conv_kernel_initializer
from keras_mvit2.layers.inverted_residual import InvertedResidual, batch_norm
from keras_mvit2.models.builder_utils import classifier_head, conv_stem, load_weights, model_input
from keras_mvit2.models.mobilevit.mobilevit_block import MobileViTBlock
from keras_mvit2.models.registry import register_builder


@dataclass(frozen=True)
class MobileViTConfig:
    """One MobileViT v1 architecture (Table 4 of the paper; timm `model_cfgs`).

    Stages: 0 = one MV2 block (stride 1); 1 = `stage1_depth` MV2 blocks (the
    first with stride 2); 2, 3, 4 = an MV2 block with stride 2 followed by a
    MobileViT block. A 1x1 conv to `num_features` (BN + SiLU) ends the network.
    """

    stem_filters: int
    stage_filters: tuple[int, int, int, int, int]
    transformer_dims: tuple[int, int, int]
    num_features: int
    expansion: float = 4.0
    transformer_depths: tuple[int, int, int] = (2, 4, 3)
    stage1_depth: int = 3
    patch_size: int = 2
    num_heads: int = 4
    mlp_ratio: float = 2.0


#: The published variants (timm `mobilevit_xxs` / `_xs` / `_s`).
MOBILEVIT_CONFIGS: dict[str, MobileViTConfig] = {
    "xxs": MobileViTConfig(16, (16, 24, 48, 64, 80), (64, 80, 96), 320, expansion=2.0),
    "xs": MobileViTConfig(16, (32, 48, 64, 80, 96), (96, 120, 144), 384),
    "s": MobileViTConfig(16, (32, 64, 96, 128, 160), (144, 192, 240), 640),
}


def _config_of(variant) -> tuple[MobileViTConfig, str | None]:
    if isinstance(variant, MobileViTConfig):
        return variant, None
    if isinstance(variant, str) and variant.lower() in MOBILEVIT_CONFIGS:
        key = variant.lower()
        return MOBILEVIT_CONFIGS[key], f"mobilevit_{key}"
    raise ValueError(
        f"variant must be one of {sorted(MOBILEVIT_CONFIGS)} or a MobileViTConfig. "
        f"Received: variant={variant!r}"
    )


def MobileViT(  # noqa: N802 (keras.applications naming)
    variant="xxs",
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
    attention="mha",
    attn_dropout: float = 0.0,
    block_dropout: float = 0.0,
) -> keras.Model:
    """Builds a MobileViT v1 image classifier or backbone (channels-last).

    The architecture and every tensor follow timm's `mobilevit_xxs/xs/s` (so
    that timm checkpoints port with `keras_mvit2.models.timm_port.load_timm_weights`):
    stem conv 3x3 / 2 (BN, SiLU), MobileNetV2 blocks (expansion 2 for XXS, 4
    otherwise), three MobileViT blocks (patch 2x2, 4 heads, MLP ratio 2, SiLU,
    fusion with the block input), a 1x1 conv to 320 / 384 / 640 channels, global
    average pooling and the classifier. Stride-2 convolutions pad like PyTorch.

    Args:
        variant: `"xxs"`, `"xs"`, `"s"` or a `MobileViTConfig`.
        include_top: bool. Add global average pooling and the Dense classifier.
        weights: `None` (random init) or the path of a checkpoint: a timm
            `.pth` / `.bin` / `.safetensors` of the same variant, or a Keras
            `.weights.h5`. Nothing is downloaded.
        input_tensor: optional Keras tensor to use as the image input.
        input_shape: `(height, width, 3)`; height and width may be `None` (one model
            for every size). Defaults to `(256, 256, 3)`.
            Inputs are RGB in [0, 1] (timm: mean 0, std 1).
        pooling: `None`, `"avg"` or `"max"` when `include_top=False`.
        classes: int. Number of classes of the classifier.
        classifier_activation: activation of the classifier; `None` gives logits.
        dropout: float. Dropout before the classifier (timm uses 0; the paper 0.1).
        name: model name. Defaults to `mobilevit_<variant>`.
        attention: the attention inside every MobileViT block: `"mha"` (the
            paper) or any name of `keras_mvit2.attention.available()`, a config
            dict or a layer. `num_heads=4` is passed to the mechanisms that take it.
        attn_dropout: float. Dropout on the attention weights (reference 0).
        block_dropout: float. Dropout on attention and MLP outputs (reference 0).

    Returns:
        A `keras.Model` (Functional).

    Example:
    >>> model = keras_mvit2.models.MobileViT("xxs")
    >>> model.output_shape
    (None, 1000)
    """
    config, default_name = _config_of(variant)
    inputs, x = model_input(input_tensor, input_shape)

    x = conv_stem(x, config.stem_filters)
    filters, expansion = config.stage_filters, config.expansion
    x = InvertedResidual(filters[0], 1, expansion, name="stage0_block0")(x)
    for j in range(config.stage1_depth):
        x = InvertedResidual(filters[1], 2 if j == 0 else 1, expansion,
                             name=f"stage1_block{j}")(x)
    for i in range(3):
        stage = i + 2
        x = InvertedResidual(filters[stage], 2, expansion, name=f"stage{stage}_block0")(x)
        x = MobileViTBlock(
            config.transformer_dims[i],
            config.transformer_depths[i],
            attention=attention,
            num_heads=config.num_heads,
            mlp_ratio=config.mlp_ratio,
            patch_size=config.patch_size,
            attn_dropout=attn_dropout,
            dropout=block_dropout,
            name=f"stage{stage}_block1",
        )(x)

    x = keras.layers.Conv2D(
        config.num_features, 1, use_bias=False, kernel_initializer=conv_kernel_initializer(),
        name="final_conv",
    )(x)
    x = batch_norm("final_bn")(x)
    x = keras.layers.Activation("silu", name="final_act")(x)

    outputs = classifier_head(
        x,
        include_top=include_top,
        pooling=pooling,
        classes=classes,
        classifier_activation=classifier_activation,
        dropout=dropout,
    )
    model = keras.Model(inputs, outputs, name=name or default_name or "mobilevit")
    load_weights(model, weights)
    return model


def _named_builder(variant: str, name: str):
    return register_builder(
        name, lambda **kwargs: MobileViT(variant, **kwargs),
        f"MobileViT v1-{variant.upper()} (`MobileViT({variant!r})`, timm `{name}`); "
        "keyword arguments as `MobileViT`.",
    )


mobilevit_xxs = _named_builder("xxs", "mobilevit_xxs")
mobilevit_xs = _named_builder("xs", "mobilevit_xs")
mobilevit_s = _named_builder("s", "mobilevit_s")
