"""The preprocessor of `MobileViTV2ImageClassifier`."""

from __future__ import annotations

import keras_hub

from keras_mvit2.api_export import serializable
from keras_mvit2.models.mobilevitv2.mobilevitv2_backbone import MobileViTV2Backbone
from keras_mvit2.models.mobilevitv2.mobilevitv2_image_converter import MobileViTV2ImageConverter


@serializable
class MobileViTV2ImageClassifierPreprocessor(keras_hub.models.ImageClassifierPreprocessor):
    """Raw images (and labels) -> `MobileViTV2ImageClassifier` inputs.

    Applies a `MobileViTV2ImageConverter` (the checkpoint's evaluation transform) to
    `x` and passes `y` / `sample_weight` through; runs in the `tf.data` pipeline of
    `fit` / `predict` / `evaluate`.

    Args:
        image_converter: a `MobileViTV2ImageConverter` (or `None`: no conversion).

    Example:
        ```python
        preprocessor = keras_mvit2.kerashub.MobileViTV2ImageClassifierPreprocessor(
            keras_mvit2.kerashub.MobileViTV2ImageConverter((256, 256)))
        x, y = preprocessor(np.zeros((2, 300, 400, 3), "uint8"), [0, 1])
        ```
    """

    backbone_cls = MobileViTV2Backbone
    image_converter_cls = MobileViTV2ImageConverter
