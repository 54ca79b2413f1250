"""keras_mvit2: MobileViTv2 and linear-cost attention for Keras 3, TFLite and CoreML."""

__version__ = "0.1.0"

import os as _os

# TensorFlow's C++ start-up chatter (oneDNN, CUDA probing) hides our output; keep the
# user's own setting when there is one.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_mvit2 import layers, models
from keras_mvit2.models import (
    MobileViTV2,
    create_model,
    list_models,
    mobilevitv2_050,
    mobilevitv2_075,
    mobilevitv2_100,
    mobilevitv2_125,
    mobilevitv2_150,
    mobilevitv2_175,
    mobilevitv2_200,
    preprocess_input,
)

__all__ = [
    "MobileViTV2",
    "__version__",
    "create_model",
    "layers",
    "list_models",
    "mobilevitv2_050",
    "mobilevitv2_075",
    "mobilevitv2_100",
    "mobilevitv2_125",
    "mobilevitv2_150",
    "mobilevitv2_175",
    "mobilevitv2_200",
    "models",
    "preprocess_input",
]
