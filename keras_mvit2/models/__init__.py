"""The model families, one folder each (`mobilevitv2/`, `mobilevit/`, `vit/`: block,
builders, and for MobileViTv2 its published checkpoints, port and KerasHub classes), the
registry, porting any of them from PyTorch (`torch_weights`), and `weights_source`
(what `finetune` starts from)."""

from keras_mvit2.models.input_size import with_input_size
from keras_mvit2.models.mobilevit import (
    MOBILEVIT_CONFIGS,
    MobileViT,
    MobileViTBlock,
    MobileViTConfig,
    mobilevit_s,
    mobilevit_xs,
    mobilevit_xxs,
)
from keras_mvit2.models.mobilevitv2 import (
    MobileViTV2,
    MobileViTV2Block,
    decode_predictions,
    list_weights,
    mobilevitv2_050,
    mobilevitv2_075,
    mobilevitv2_100,
    mobilevitv2_125,
    mobilevitv2_150,
    mobilevitv2_175,
    mobilevitv2_200,
    mobilevitv2_widths,
    preprocess_input,
)
from keras_mvit2.models.registry import create_model, list_models, register_model
from keras_mvit2.models.torch_weights import convert_weights, load_torch_weights
from keras_mvit2.models.vit import (
    DEIT_CONFIGS,
    ClassTokenPositionEmbedding,
    PatchEmbedding,
    TokenPooling,
    ViT,
    ViTBlock,
    deit_base,
    deit_small,
    deit_tiny,
)

__all__ = [
    "DEIT_CONFIGS",
    "MOBILEVIT_CONFIGS",
    "ClassTokenPositionEmbedding",
    "MobileViT",
    "MobileViTBlock",
    "MobileViTConfig",
    "MobileViTV2",
    "MobileViTV2Block",
    "PatchEmbedding",
    "TokenPooling",
    "ViT",
    "ViTBlock",
    "convert_weights",
    "create_model",
    "decode_predictions",
    "deit_base",
    "deit_small",
    "deit_tiny",
    "list_models",
    "list_weights",
    "load_torch_weights",
    "mobilevit_s",
    "mobilevit_xs",
    "mobilevit_xxs",
    "mobilevitv2_050",
    "mobilevitv2_075",
    "mobilevitv2_100",
    "mobilevitv2_125",
    "mobilevitv2_150",
    "mobilevitv2_175",
    "mobilevitv2_200",
    "mobilevitv2_widths",
    "preprocess_input",
    "register_model",
    "with_input_size",
]
