"""A `keras_mvit2.MobileViTV2` classifier -> the same model as a KerasHub classifier.

`classifier_from_model` is also how
`keras_mvit2.models.mobilevitv2.mobilevitv2_preset_resolver` turns a published checkpoint
or a timm one into a preset: importing this module registers it there.
"""

from __future__ import annotations

import keras

from keras_mvit2.models.mobilevitv2.mobilevitv2_backbone import MobileViTV2Backbone
from keras_mvit2.models.mobilevitv2.mobilevitv2_image_classifier import MobileViTV2ImageClassifier
from keras_mvit2.models.mobilevitv2.mobilevitv2_image_classifier_preprocessor import (
    MobileViTV2ImageClassifierPreprocessor,
)
from keras_mvit2.models.mobilevitv2.mobilevitv2_image_converter import MobileViTV2ImageConverter
from keras_mvit2.models.mobilevitv2.mobilevitv2_preset_resolver import register_classifier_factory


def classifier_from_model(
    model: keras.Model,
    width_multiplier: float,
    *,
    attention="separable",
    crop_pct: float | None = None,
    interpolation: str = "bicubic",
    scale=1.0 / 255.0,
    offset=None,
    activation: str | None = None,
) -> MobileViTV2ImageClassifier:
    """The `MobileViTV2ImageClassifier` holding `model`'s weights (copied by name).

    Args:
        model: a classifier built by `keras_mvit2.MobileViTV2(width_multiplier,
            include_top=True, ...)` (or `create_model`), e.g. with `weights="imagenet"`
            or after `mvit2 train`.
        width_multiplier: the width `model` was built with.
        attention: the `attention=` `model` was built with.
        crop_pct: center-crop fraction of the image converter; default: the
            checkpoint's when `model` was built with `weights=<tag>`, else 1.0 at 384
            and 0.888 otherwise (`keras_mvit2.preprocessing.eval_transform`).
        interpolation: resize interpolation of the image converter.
        scale, offset: of the image converter (the checkpoints: 1/255 and none).
        activation: of the classifier (`None`: logits).

    Returns:
        The classifier (input size: `model`'s), with a preprocessor whose converter
        applies the evaluation transform, so `classifier.predict(uint8 photos)` equals
        `model.predict(keras_mvit2.preprocess_images(photos, model))`.

    Raises:
        ValueError: `model` has no `predictions` classifier, or its variables are not
            those of a MobileViTv2 of this width and attention.
    """
    from keras_mvit2.preprocessing import eval_transform

    try:
        head = model.get_layer("predictions")
    except ValueError:
        head = None
    if head is None or not isinstance(head, keras.layers.Dense):
        raise ValueError(
            "classifier_from_model needs a MobileViTV2 built with include_top=True (a Dense "
            f"layer named 'predictions'). Received: model {model.name!r}"
        )
    image_shape = tuple(model.input_shape[1:])
    backbone = MobileViTV2Backbone(width_multiplier, image_shape=image_shape,
                                   attention=attention, name=model.name)
    source = {v.path: v for v in model.weights}
    missing = [v.path for v in backbone.weights
               if v.path not in source or tuple(source[v.path].shape) != tuple(v.shape)]
    if missing:
        raise ValueError(
            f"{model.name!r} is not a MobileViTV2 of width {width_multiplier} with "
            f"attention={attention!r}: {len(missing)} backbone variables are missing or of "
            f"another shape, e.g. {missing[:3]}. Received: width_multiplier="
            f"{width_multiplier}"
        )
    for variable in backbone.weights:
        variable.assign(source[variable.path])
    size, crop = eval_transform(model, crop_pct)
    converter = MobileViTV2ImageConverter((size, size), crop_pct=crop,
                                          interpolation=interpolation, scale=scale,
                                          offset=offset, name="image_converter")
    classifier = MobileViTV2ImageClassifier(
        backbone=backbone,
        num_classes=int(head.units),
        preprocessor=MobileViTV2ImageClassifierPreprocessor(converter, name="preprocessor"),
        activation=activation,
        name=f"{model.name}_classifier",
    )
    classifier.output_dense.kernel.assign(head.kernel)
    classifier.output_dense.bias.assign(head.bias)
    return classifier


register_classifier_factory(classifier_from_model)
