"""keras_mvit2: MobileViTv2 and linear-cost attention for Keras 3, TFLite and CoreML."""

# `_startup` first: it loads TensorFlow (on the TensorFlow backend only) without its C++
# start-up INFO lines.
from keras_mvit2 import (
    _startup,
    layers,
    models,
    tasks,
    visualize,
)
from keras_mvit2._version import __version__
from keras_mvit2.backend import lazy_attributes

# `mv.attention`: the attention registry (`get`, `available`, `register`, ...).
from keras_mvit2.layers import attention_registry as attention
from keras_mvit2.models import (
    MobileViT,
    MobileViTV2,
    ViT,
    create_model,
    decode_predictions,
    list_models,
    list_weights,
    load_torch_weights,
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

#: The parts imported here on the TensorFlow backend and on first use on JAX and PyTorch
#: (importing them here would load TensorFlow, or the torch road's converters), with what
#: they do there (`keras_mvit2.backend` holds the policy):
#:
#: | name       | JAX                                  | PyTorch                              |
#: |------------|--------------------------------------|--------------------------------------|
#: | `data`     | runs: tf.data and numpy / PIL input  | runs: numpy / PIL input (its tf.data |
#: |            |                                      | names raise)                         |
#: | `export`   | raises                               | runs: the torch road (TFLite, Core   |
#: |            |                                      | ML, Core AI; the TensorFlow road's   |
#: |            |                                      | names raise)                         |
#: | `quantize` | raises                               | raises                               |
#: | `profile`  | raises                               | raises                               |
#:
#: "raises": `keras_mvit2.backend.TensorFlowBackendRequiredError`, naming the backend and
#: the fix. `training` is imported on every backend (every backend trains), and so is
#: `tasks` (its models register their classes for `keras.saving.load_model`; its
#: TensorFlow-only names are lazy in turn).
_IMPORTED_ON_FIRST_USE = {
    "data": ("keras_mvit2.data", None),
    "export": ("keras_mvit2.export", None),
    "quantize": ("keras_mvit2.quantize", None),
    "profile": ("keras_mvit2.profiling", "profile"),
}
if _startup.TENSORFLOW_BACKEND:
    from keras_mvit2 import data, export, quantize
    from keras_mvit2.profiling import profile

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
    "optimizer",
    "preprocess_images",
    "preprocess_input",
    "preprocessing_model",
    "profile",
    "quantize",
    "tasks",
    "visualize",
    "with_input_size",
]

if not _startup.TENSORFLOW_BACKEND:  # `from keras_mvit2 import *` loads no TensorFlow
    __all__ = [name for name in __all__ if name not in _IMPORTED_ON_FIRST_USE]


# `keras_mvit2.kerashub` needs the `hub` extra (keras-hub), and the budget optimizer
# (`mv.optimizer.optimize`) imports export, quantization and latency: both on first use only.
__getattr__ = lazy_attributes(
    __name__, {**_IMPORTED_ON_FIRST_USE, "kerashub": ("keras_mvit2.kerashub", None),
               "optimizer": ("keras_mvit2.optimizer", None)})


# Last: registers keras_mvit2.kerashub with KerasHub once keras_hub is imported (not before).
from keras_mvit2 import _keras_hub_hook  # noqa: E402

_keras_hub_hook.install()
