"""Model builders and the registry."""

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
from keras_mvit2.models.registry import create_model, list_models, register_model

__all__ = [
    "MobileViTV2",
    "create_model",
    "decode_predictions",
    "list_models",
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
]
