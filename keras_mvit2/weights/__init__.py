"""Porting PyTorch checkpoints to keras_mvit2 models, and the published checkpoints
(`pretrained`: the one table; `download`; `source`: what `finetune` starts from).

MobileViTv2 reads Apple ml-cvnets, timm and HF transformers names; MobileViT v1
and ViT / DeiT read timm names. This sub-package stands below `keras_mvit2.models`
(whose `weights=` reads it) and imports only `layers` and `utils`; building a model by
name and porting into it is `keras_mvit2.models.convert_weights`.
"""

import os
from collections.abc import Mapping
from typing import Any

import keras

from keras_mvit2.layers.mobilevit_block import MobileViTBlock
from keras_mvit2.layers.mobilevitv2_block import MobileViTV2Block
from keras_mvit2.layers.vit_layers import PatchEmbedding
from keras_mvit2.weights import mobilevitv2_port
from keras_mvit2.weights.mobilevitv2_port import cvnets_to_timm_key
from keras_mvit2.weights.timm_port import load_timm_weights
from keras_mvit2.weights.torch_checkpoint import read_torch_state_dict


def _layers(model: keras.Model):
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from _layers(layer)


def load_torch_weights(
    model: keras.Model, path_or_state_dict: str | os.PathLike | Mapping[str, Any]
) -> None:
    """Ports a PyTorch checkpoint (file or state dict) into a keras_mvit2 model.

    MobileViTv2 models accept Apple ml-cvnets `.pt`, timm and HF checkpoints;
    MobileViT v1 and ViT / DeiT accept timm checkpoints. Every tensor is checked
    (names and shapes) before any variable is assigned.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"load_torch_weights needs a keras.Model. Received: {type(model)!r}")
    layers = list(_layers(model))
    if any(isinstance(layer, MobileViTV2Block) for layer in layers):
        mobilevitv2_port.load_torch_weights(model, path_or_state_dict)
    elif any(isinstance(layer, MobileViTBlock | PatchEmbedding) for layer in layers):
        load_timm_weights(model, path_or_state_dict)
    else:
        raise ValueError(
            "load_torch_weights ports models built by keras_mvit2: MobileViTv2 "
            "(keras_mvit2.MobileViTV2), MobileViT v1 (keras_mvit2.MobileViT) and ViT / DeiT "
            f"(keras_mvit2.ViT). Model {model.name!r} is none of them; build it with one "
            "of these builders (or create_model) and port into that."
        )


__all__ = [
    "cvnets_to_timm_key",
    "load_timm_weights",
    "load_torch_weights",
    "read_torch_state_dict",
]
