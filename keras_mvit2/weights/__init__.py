"""Porting PyTorch MobileViTv2 checkpoints (Apple ml-cvnets, timm, HF transformers) to Keras."""

from keras_mvit2.weights.mobilevitv2_port import (
    convert_weights,
    cvnets_to_timm_key,
    load_torch_weights,
)
from keras_mvit2.weights.torch_checkpoint import read_torch_state_dict

__all__ = [
    "convert_weights",
    "cvnets_to_timm_key",
    "load_torch_weights",
    "read_torch_state_dict",
]
