"""Porting a PyTorch checkpoint into any keras_mvit2 model (`load_torch_weights`, as
`keras_mvit2.load_torch_weights`), and a registered model's `.weights.h5` from one
(`convert_weights`).

Each family ports its own names: MobileViTv2 reads Apple ml-cvnets, timm and HF
transformers names (`keras_mvit2.models.mobilevitv2.mobilevitv2_port`); MobileViT v1 and
ViT / DeiT read timm names (`keras_mvit2.models.timm_port`).
"""

import os
from collections.abc import Mapping
from typing import Any

import keras

from keras_mvit2.models.mobilevit.mobilevit_block import MobileViTBlock
from keras_mvit2.models.mobilevitv2 import mobilevitv2_port
from keras_mvit2.models.mobilevitv2.mobilevitv2_block import MobileViTV2Block
from keras_mvit2.models.registry import create_model
from keras_mvit2.models.timm_port import load_timm_weights
from keras_mvit2.models.vit.vit_layers import PatchEmbedding
from keras_mvit2.utils.files import atomic_output
from keras_mvit2.weights.torch_checkpoint import read_torch_state_dict

__all__ = ["convert_weights", "load_torch_weights"]


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
    layers = list(model._flatten_layers(include_self=False))
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


def convert_weights(
    src: str | os.PathLike | Mapping[str, Any],
    dst: str | os.PathLike,
    model: str = "mobilevitv2_100",
    **model_kwargs: Any,
) -> keras.Model:
    """Converts a PyTorch checkpoint into a Keras `.weights.h5` file.

    Builds `keras_mvit2.create_model(model, **model_kwargs)`, ports `src` into it
    with `load_torch_weights` and saves the weights to `dst`
    atomically (a failure leaves no partial file and keeps an existing `dst`).

    Args:
        src: PyTorch checkpoint path (or state dict), see `load_torch_weights`.
        dst: output path; must end with `.weights.h5`.
        model: registered model name, e.g. `"mobilevitv2_050"` or `"deit_tiny"`.
        **model_kwargs: passed to the builder (`classes`, `include_top`,
            `input_shape`, ...). `weights` is not allowed.

    Returns:
        The ported Keras model.
    """
    dst_path = os.fspath(dst)
    if not dst_path.endswith(".weights.h5"):
        raise ValueError(
            f"dst must end with '.weights.h5' (Keras' weights format). Received: dst={dst_path!r}"
        )
    if "weights" in model_kwargs:
        raise ValueError("convert_weights builds the model without weights; do not pass weights=.")
    state_dict = read_torch_state_dict(src)  # fail fast, before building a model
    keras_model = create_model(model, **model_kwargs)
    load_torch_weights(keras_model, state_dict)
    with atomic_output(dst_path) as tmp:
        keras_model.save_weights(tmp)
    return keras_model
