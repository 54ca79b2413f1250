"""The classifiers of a run: the training network (logits, pretrained weights, freezing)
and the float32 inference model with softmax that is saved."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from keras_mvit2.models import create_model
from keras_mvit2.training.config import TrainConfig
from keras_mvit2.training.distribute import precision_policy
from keras_mvit2.utils.model_files import check_file_format, load_keras_model

HEAD_LAYERS = ("predictions", "head_dropout")


def _build_kwargs(config: TrainConfig, num_classes: int, *,
                  any_size: bool = False) -> dict[str, Any]:
    m = config.model
    side = None if any_size else m.image_size
    kwargs: dict[str, Any] = {
        "input_shape": (side, side, 3),
        "classes": num_classes,
    }
    if m.dropout:
        kwargs["dropout"] = m.dropout
    if m.drop_path_rate:
        kwargs["drop_path_rate"] = m.drop_path_rate
    if m.attention is not None:
        kwargs["attention"] = m.attention
    return kwargs


#: Where a `.weights.h5` file keeps the classifier's kernel: Keras 3 names a model's layers
#: in the file by class (`layers/dense`: the models' only top-level Dense is `predictions`);
#: files of older Keras versions by layer name.
_H5_HEAD_KERNELS = ("layers/dense/vars/0", "layers/predictions/vars/0")


def _h5_head_classes(path: str) -> int | None:
    """The classes of the classifier a `.weights.h5` file holds, or None without one."""
    import h5py

    with h5py.File(path, "r") as f:
        for key in _H5_HEAD_KERNELS:
            if key in f:
                return int(f[key].shape[-1])
    return None


def check_pretrained_weights(config: TrainConfig) -> None:
    """Raises when `config.model.weights` is set but missing or not what its name says."""
    path = config.model.weights
    if not path:
        return
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"Pretrained weights not found: {path!r} (config model.weights). Pass an "
            "ml-cvnets .pt, a timm .pth/.bin/.safetensors, or a Keras .weights.h5 or "
            ".keras."
        )
    check_file_format(path, what=f"The pretrained weights {path!r} (config model.weights)")


def load_pretrained(model: keras.Model, config: TrainConfig, num_classes: int) -> int:
    """Copies pretrained weights (`config.model.weights`) into `model`, layer by layer.

    The source is an Apple ml-cvnets / timm / HF checkpoint (ported with
    `load_torch_weights`), or a Keras `.weights.h5` or `.keras` model of the same
    architecture (any classifier size, or none). The classifier is copied only when
    `model.new_head` is false and the source's classifier has `num_classes` outputs;
    otherwise it keeps its fresh initialization. Returns the number of layers copied.
    """
    check_pretrained_weights(config)
    path = config.model.weights
    kwargs = _build_kwargs(config, num_classes)
    kwargs.pop("classes")
    with precision_policy("float32"):
        if path.endswith(".keras"):
            donor = load_keras_model(path)
            head = next((int(layer.weights[0].shape[-1]) for layer in donor.layers
                         if layer.name == "predictions" and layer.weights), None)
        elif path.endswith(".weights.h5"):
            head = _h5_head_classes(path)
            donor = create_model(config.model.name, include_top=head is not None,
                                 classes=head or 1, classifier_activation=None, **kwargs)
            donor.load_weights(path)
        else:
            head = num_classes if not config.model.new_head else None
            donor = create_model(config.model.name, include_top=head is not None,
                                 classes=head or 1, classifier_activation=None,
                                 weights=path, **kwargs)
    copy_head = not config.model.new_head and head == num_classes
    copied = 0
    names = {layer.name for layer in model.layers}
    for layer in donor.layers:
        if not layer.weights or layer.name not in names:
            continue
        if layer.name in HEAD_LAYERS and not copy_head:
            continue
        model.get_layer(layer.name).set_weights(layer.get_weights())
        copied += 1
    if copied == 0:
        raise ValueError(
            f"No layer of {path!r} matches the model {config.model.name!r}; is it a "
            f"checkpoint of this architecture? Received: weights={path!r}"
        )
    return copied


def build_classifier(config: TrainConfig, num_classes: int, *,
                     any_size: bool = False) -> keras.Model:
    """The training classifier (logits), with pretrained weights and freezing applied.

    Built for `config.model.image_size`, or for any input size with `any_size` (the
    multi-scale classifier: one model for every batch shape).
    """
    model = create_model(config.model.name, classifier_activation=None,
                         **_build_kwargs(config, num_classes, any_size=any_size))
    if config.model.weights:
        load_pretrained(model, config, num_classes)
    if config.model.freeze_backbone:
        for layer in model.layers:
            layer.trainable = layer.name in HEAD_LAYERS
    if config.model.sync_batch_norm:
        for layer in model._flatten_layers():
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.synchronized = True
    return model


def build_inference_model(config: TrainConfig, num_classes: int,
                          values: Sequence[np.ndarray]) -> keras.Model:
    """The float32 model with softmax that is saved: same architecture, given weights."""
    with precision_policy("float32"):
        model = create_model(config.model.name, classifier_activation="softmax",
                             **_build_kwargs(config, num_classes))
    if len(values) != len(model.weights):
        raise ValueError(
            f"Expected {len(model.weights)} weight arrays for {config.model.name!r}. "
            f"Received: {len(values)}"
        )
    model.set_weights(list(values))
    return model
