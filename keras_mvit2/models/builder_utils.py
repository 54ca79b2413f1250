"""Input, stem, head and weight-loading conventions shared by the model builders
(the `keras.applications` signature: include_top, weights, input_tensor, input_shape,
pooling, classes, classifier_activation)."""

import os

import keras

from keras_mvit2.layers.initializers import conv_kernel_initializer
from keras_mvit2.layers.inverted_residual import batch_norm

DEFAULT_INPUT_SHAPE = (256, 256, 3)


def model_input(input_tensor, input_shape, min_size: int = 32,
                default_shape: tuple = DEFAULT_INPUT_SHAPE):
    """Validates `input_shape` / `input_tensor` and returns `(inputs, x)`.

    Shapes are channels-last; `default_shape` when neither is given. Height and
    width may be `None` (one model for any size: the MobileViT blocks read their
    patch grid from each call's input); a static side must be at least `min_size`.
    """
    if keras.config.image_data_format() != "channels_last":
        raise ValueError(
            "keras_mvit2 models are channels-last. Set keras.config.set_image_data_format("
            f"'channels_last'). Received: image_data_format={keras.config.image_data_format()!r}"
        )
    if input_tensor is not None and input_shape is None:
        input_shape = tuple(input_tensor.shape[1:])
    input_shape = tuple(default_shape if input_shape is None else input_shape)
    if len(input_shape) != 3:
        raise ValueError(
            f"input_shape must be (height, width, channels). Received: input_shape={input_shape}"
        )
    height, width, channels = input_shape
    if channels is None:
        raise ValueError(
            "input_shape needs a known number of channels, e.g. (None, None, 3). "
            f"Received: input_shape={input_shape}"
        )
    if any(side is not None and side < min_size for side in (height, width)):
        raise ValueError(
            f"input_shape must be at least {min_size}x{min_size}. "
            f"Received: input_shape={input_shape}"
        )
    if input_tensor is None:
        inputs = keras.Input(shape=input_shape, name="image")
        return inputs, inputs
    if not keras.backend.is_keras_tensor(input_tensor):
        inputs = keras.Input(tensor=input_tensor, shape=input_shape, name="image")
        return inputs, inputs
    return keras.utils.get_source_inputs(input_tensor), input_tensor


def conv_stem(x, filters: int):
    """The stem of both MobileViTs: 3x3 stride-2 conv (PyTorch's padding 1) + BN + SiLU,
    layers `stem_pad`, `stem_conv`, `stem_bn`, `stem_act`."""
    x = keras.layers.ZeroPadding2D(1, name="stem_pad")(x)
    x = keras.layers.Conv2D(filters, 3, strides=2, use_bias=False,
                            kernel_initializer=conv_kernel_initializer(), name="stem_conv")(x)
    x = batch_norm("stem_bn")(x)
    return keras.layers.Activation("silu", name="stem_act")(x)


def classifier_head(x, *, include_top, pooling, classes, classifier_activation, dropout):
    """Global average pooling + (dropout) + Dense head, or the requested pooling."""
    if include_top:
        if classes <= 0:
            raise ValueError(f"classes must be positive. Received: classes={classes}")
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        return dense_classifier(x, classes, classifier_activation, dropout)
    if pooling == "avg":
        return keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    if pooling == "max":
        return keras.layers.GlobalMaxPooling2D(name="max_pool")(x)
    if pooling is not None:
        raise ValueError(f"pooling must be None, 'avg' or 'max'. Received: pooling={pooling!r}")
    return x


def dense_classifier(x, classes, classifier_activation, dropout):
    """(Dropout `head_dropout`) + the Dense classifier `predictions` on features `(B, D)`."""
    if dropout:
        x = keras.layers.Dropout(dropout, name="head_dropout")(x)
    return keras.layers.Dense(
        classes,
        activation=classifier_activation,
        kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        name="predictions",
    )(x)


def load_weights(model: keras.Model, weights) -> None:
    """Loads `weights` (a file path) into `model`: PyTorch checkpoints or Keras `.weights.h5`."""
    if weights is None:
        return
    if not isinstance(weights, str | os.PathLike):
        raise ValueError(f"weights must be None or a file path. Received: weights={weights!r}")
    path = os.fspath(weights)
    from keras_mvit2.models.mobilevitv2.mobilevitv2_presets import is_weights_tag

    if is_weights_tag(path) and not os.path.exists(path):
        raise ValueError(
            f"weights={path!r}: keras_mvit2 publishes weights for MobileViTv2 only "
            f"(keras_mvit2.list_weights()); model {model.name!r} has none. Pass the path of a "
            "checkpoint file instead: a timm .pth/.bin/.safetensors or a Keras .weights.h5 "
            "(see `mvit2 convert-weights`)."
        )
    if not os.path.exists(path):
        raise FileNotFoundError(f"Weights file not found: {path!r}")
    from keras_mvit2.utils.model_files import check_file_format

    check_file_format(path, what=f"weights={path!r}")
    if path.endswith(".weights.h5"):
        model.load_weights(path)
        return
    from keras_mvit2.models.torch_weights import load_torch_weights

    load_torch_weights(model, path)
