"""keras_mvit2: MobileViTv2 and linear-cost attention for Keras 3, TFLite and CoreML."""

# `_startup` first: it loads TensorFlow without its C++ start-up INFO lines.
from keras_mvit2 import (
    _startup,  # noqa: F401
    attention,
    data,
    export,
    layers,
    models,
    quantize,
    tasks,
    visualize,
)
from keras_mvit2._version import __version__
from keras_mvit2.models import (
    MobileViT,
    MobileViTV2,
    ViT,
    create_model,
    decode_predictions,
    list_models,
    mobilevitv2_050,
    mobilevitv2_075,
    mobilevitv2_100,
    mobilevitv2_125,
    mobilevitv2_150,
    mobilevitv2_175,
    mobilevitv2_200,
    preprocess_input,
    with_input_size,
)
from keras_mvit2.preprocessing import preprocess_images, preprocessing_model
from keras_mvit2.profiling import profile
from keras_mvit2.weights import load_torch_weights
from keras_mvit2.weights.pretrained import list_weights

__all__ = [
    "MobileViT",
    "MobileViTV2",
    "ViT",
    "__version__",
    "attention",
    "create_model",
    "data",
    "decode_predictions",
    "export",
    "layers",
    "list_models",
    "list_weights",
    "load_torch_weights",
    "mobilevitv2_050",
    "mobilevitv2_075",
    "mobilevitv2_100",
    "mobilevitv2_125",
    "mobilevitv2_150",
    "mobilevitv2_175",
    "mobilevitv2_200",
    "models",
    "preprocess_images",
    "preprocess_input",
    "preprocessing_model",
    "profile",
    "quantize",
    "tasks",
    "visualize",
    "with_input_size",
]


def __getattr__(name: str):
    # `keras_mvit2.kerashub` needs the `hub` extra (keras-hub): imported on first use only.
    if name == "hub":
        import importlib

        return importlib.import_module("keras_mvit2.kerashub")
    raise AttributeError(f"module 'keras_mvit2' has no attribute {name!r}")


# Last: registers keras_mvit2.kerashub with KerasHub once keras_hub is imported (not before).
from keras_mvit2 import _keras_hub_hook  # noqa: E402

_keras_hub_hook.install()
