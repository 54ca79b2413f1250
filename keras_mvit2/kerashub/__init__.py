"""MobileViTv2 in KerasHub: `MobileViTV2Backbone`, `MobileViTV2ImageClassifier` (with
presets), their preprocessor and image converter: the public namespace of the KerasHub
classes that live with the rest of their family in `keras_mvit2/models/mobilevitv2/`.

Needs the `hub` extra (`pip install keras_mvit2[hub]`: keras-hub). `import keras_mvit2`
does not import keras-hub; this module is imported (and its classes registered for
KerasHub's `from_preset`) as soon as `keras_hub` is imported, or with
`import keras_mvit2.kerashub`.
"""

try:
    import keras_hub  # noqa: F401
except ImportError as err:
    raise ImportError(
        "keras_mvit2.kerashub needs keras-hub: pip install 'keras_mvit2[hub]' (keras-hub 0.32.0 "
        f"and tensorflow-text 2.21). ({err})"
    ) from err

from keras_mvit2.kerashub.convert import classifier_from_model
from keras_mvit2.kerashub.export import inference_model
from keras_mvit2.models.mobilevitv2.mobilevitv2_backbone import MobileViTV2Backbone
from keras_mvit2.models.mobilevitv2.mobilevitv2_image_classifier import MobileViTV2ImageClassifier
from keras_mvit2.models.mobilevitv2.mobilevitv2_image_classifier_preprocessor import (
    MobileViTV2ImageClassifierPreprocessor,
)
from keras_mvit2.models.mobilevitv2.mobilevitv2_image_converter import MobileViTV2ImageConverter
from keras_mvit2.models.mobilevitv2.mobilevitv2_presets import PRESETS

__all__ = [
    "PRESETS",
    "MobileViTV2Backbone",
    "MobileViTV2ImageClassifier",
    "MobileViTV2ImageClassifierPreprocessor",
    "MobileViTV2ImageConverter",
    "classifier_from_model",
    "inference_model",
]
