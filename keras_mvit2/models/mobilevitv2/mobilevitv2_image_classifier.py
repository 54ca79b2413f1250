"""MobileViTv2 as a KerasHub `ImageClassifier`, with presets."""

from __future__ import annotations

import keras_hub

from keras_mvit2.api_export import serializable
from keras_mvit2.models.mobilevitv2.mobilevitv2_backbone import MobileViTV2Backbone
from keras_mvit2.models.mobilevitv2.mobilevitv2_image_classifier_preprocessor import (
    MobileViTV2ImageClassifierPreprocessor,
)
from keras_mvit2.models.mobilevitv2.mobilevitv2_presets import PresetsProperty


@serializable
class MobileViTV2ImageClassifier(keras_hub.models.ImageClassifier):
    """MobileViTv2 image classifier: `MobileViTV2Backbone` + average pooling + Dense.

    The same function as `keras_mvit2.MobileViTV2(..., classifier_activation=None)`
    with the same weights (the Dense layer is `predictions` in both). With a
    preprocessor (the default from a preset), `predict` / `fit` / `evaluate` take raw
    RGB images in [0, 255] (uint8), converted in the `tf.data` pipeline with the
    checkpoint's evaluation transform; calling the model itself takes the converted
    `(batch, size, size, 3)` input in [0, 1].

    `from_preset` takes, besides KerasHub's forms (a local preset directory,
    `kaggle://`, `hf://` KerasHub presets):

    - a published name, `"mobilevitv2_050_imagenet"` ... (`MobileViTV2ImageClassifier
      .presets`): the checkpoint is downloaded as for `MobileViTV2(weights=...)`;
    - a timm MobileViTv2 checkpoint, `"hf://timm/mobilevitv2_050.cvnets_in1k"` (or a
      local directory with timm's `config.json` and `model.safetensors`), ported on
      the fly.

    Both are converted once into a KerasHub preset directory cached under
    `$KERAS_HOME/keras_mvit2/presets` (`~/.keras`), then loaded by KerasHub's own
    loader, so `num_classes=`, `image_shape=`, `dtype=` and `load_weights=` act as
    for any KerasHub preset.

    Args:
        backbone: a `MobileViTV2Backbone`.
        num_classes: int. Number of classes.
        preprocessor: a `MobileViTV2ImageClassifierPreprocessor` or `None`.
        pooling: `"avg"` (the checkpoints') or `"max"`.
        activation: activation of the classifier; `None` (logits) by default.
        dropout: float. Dropout before the classifier.
        head_dtype: dtype policy of the head.

    Example:
        ```python
        import keras_mvit2.kerashub
        classifier = keras_mvit2.kerashub.MobileViTV2ImageClassifier.from_preset(
            "mobilevitv2_050_imagenet")
        classifier.predict(np.zeros((1, 480, 640, 3), "uint8"))  # (1, 1000) logits
        ```
    """

    backbone_cls = MobileViTV2Backbone
    preprocessor_cls = MobileViTV2ImageClassifierPreprocessor
    presets = PresetsProperty()

    @classmethod
    def from_preset(cls, preset: str, load_weights: bool = True, **kwargs):
        from keras_mvit2.models.mobilevitv2.mobilevitv2_preset_resolver import resolve_preset

        return super().from_preset(resolve_preset(preset), load_weights, **kwargs)
