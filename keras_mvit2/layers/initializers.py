"""The reference's initialization, shared by every convolution of the package."""

import keras


def conv_kernel_initializer(identifier=None) -> keras.initializers.Initializer:
    """`identifier` resolved by Keras; `None` gives the reference's He-normal (fan-out).

    ml-cvnets initializes every convolution with `kaiming_normal_(mode="fan_out")`
    and zero biases. Training from scratch needs a variance-preserving init: with
    small kernels the activations vanish and int8 models output a constant.
    """
    if identifier is not None:
        return keras.initializers.get(identifier)
    return keras.initializers.VarianceScaling(
        scale=2.0, mode="fan_out", distribution="untruncated_normal"
    )


def clone_initializer(initializer):
    """A fresh instance of `initializer` (same config), for one sublayer.

    Keras 3 returns the same values every time one unseeded initializer instance
    is called, so sublayers that share an instance start with identical weights.
    Every sublayer gets its own clone instead. Strings and dicts pass through
    (Keras builds a new instance from them anyway).
    """
    if initializer is None or isinstance(initializer, str | dict):
        return initializer
    return initializer.__class__.from_config(initializer.get_config())
