"""Model builders and the registry."""

from keras_mvit2.models.input_size import with_input_size
from keras_mvit2.models.mobilevit import (
    MOBILEVIT_CONFIGS,
    MobileViT,
    MobileViTConfig,
    mobilevit_s,
    mobilevit_xs,
    mobilevit_xxs,
)
from keras_mvit2.models.mobilevitv2 import (
    MobileViTV2,
    decode_predictions,
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
from keras_mvit2.models.registry import (
    convert_weights,
    create_model,
    list_models,
    register_model,
)
from keras_mvit2.models.vit import DEIT_CONFIGS, ViT, deit_base, deit_small, deit_tiny

__all__ = [
    "DEIT_CONFIGS",
    "MOBILEVIT_CONFIGS",
    "MobileViT",
    "MobileViTConfig",
    "MobileViTV2",
    "ViT",
    "convert_weights",
    "create_model",
    "decode_predictions",
    "deit_base",
    "deit_small",
    "deit_tiny",
    "list_models",
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
