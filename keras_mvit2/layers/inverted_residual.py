"""MobileNetV2 inverted residual block with PyTorch-style stride-2 padding."""

import keras
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.layers.initializers import clone_initializer, conv_kernel_initializer


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """ml-cvnets' channel rounding: nearest multiple of `divisor`, never below 90 % of `value`."""
    min_value = divisor if min_value is None else min_value
    rounded = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return int(rounded)


def batch_norm(name: str, epsilon: float = 1e-5, dtype=None) -> keras.layers.BatchNormalization:
    """BatchNormalization with the reference's epsilon and torch's momentum 0.1."""
    return keras.layers.BatchNormalization(epsilon=epsilon, momentum=0.9, name=name, dtype=dtype)


@serializable
class InvertedResidual(keras.layers.Layer):
    """1x1 expand + BN + SiLU, depthwise 3x3 + BN + SiLU, 1x1 project + BN.

    A residual is added when `strides == 1` and the input has `filters`
    channels. Stride 2 pads one pixel on every side and convolves with
    `"valid"`, as PyTorch's `padding=1` does (Keras' `"same"` pads only the
    bottom/right of even inputs, which shifts the output).

    Args:
        filters: int. Output channels.
        strides: int, 1 or 2. Stride of the depthwise convolution.
        expansion: float. Hidden width = `make_divisible(round(in * expansion), 8)`.
        norm_epsilon: float. BatchNormalization epsilon. Defaults to `1e-5`.
        kernel_initializer: initializer of the convolution kernels. Defaults to
            He-normal with fan-out, as the reference.

    Input shape:
        `(batch, height, width, channels)`.

    Output shape:
        `(batch, ceil(height / strides), ceil(width / strides), filters)`.

    Example:
    >>> x = keras.random.normal((1, 32, 32, 16))
    >>> keras_mvit2.layers.InvertedResidual(32, strides=2)(x).shape
    (1, 16, 16, 32)
    """

    def __init__(
        self,
        filters: int,
        strides: int = 1,
        expansion: float = 2.0,
        norm_epsilon: float = 1e-5,
        kernel_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if strides not in (1, 2):
            raise ValueError(f"strides must be 1 or 2. Received: strides={strides}")
        if filters <= 0 or expansion <= 0:
            raise ValueError(
                f"filters and expansion must be positive. Received: filters={filters}, "
                f"expansion={expansion}"
            )
        self.filters = filters
        self.strides = strides
        self.expansion = expansion
        self.norm_epsilon = norm_epsilon
        self.kernel_initializer = conv_kernel_initializer(kernel_initializer)

    def build(self, input_shape):
        channels = int(input_shape[-1])
        hidden = make_divisible(round(channels * self.expansion), 8)
        policy = self.dtype_policy
        def init():
            return clone_initializer(self.kernel_initializer)

        self.expand_conv = keras.layers.Conv2D(
            hidden, 1, use_bias=False, kernel_initializer=init(), name="expand_conv", dtype=policy
        )
        self.expand_bn = batch_norm("expand_bn", self.norm_epsilon, policy)
        self.depthwise_conv = keras.layers.DepthwiseConv2D(
            3,
            strides=self.strides,
            padding="same" if self.strides == 1 else "valid",
            use_bias=False,
            depthwise_initializer=init(),
            name="depthwise_conv",
            dtype=policy,
        )
        self.depthwise_bn = batch_norm("depthwise_bn", self.norm_epsilon, policy)
        self.project_conv = keras.layers.Conv2D(
            self.filters, 1, use_bias=False, kernel_initializer=init(), name="project_conv",
            dtype=policy,
        )
        self.project_bn = batch_norm("project_bn", self.norm_epsilon, policy)
        self.use_residual = self.strides == 1 and channels == self.filters

        batch, height, width = input_shape[0], input_shape[1], input_shape[2]
        hidden_shape = (batch, height, width, hidden)
        self.expand_conv.build(input_shape)
        self.expand_bn.build(hidden_shape)
        pad = 2 if self.strides == 2 else 0
        self.depthwise_conv.build(
            (batch, None if height is None else height + pad,
             None if width is None else width + pad, hidden)
        )
        self.depthwise_bn.build(hidden_shape)
        self.project_conv.build(hidden_shape)
        self.project_bn.build(hidden_shape[:-1] + (self.filters,))

    def call(self, inputs, training=None):
        x = ops.silu(self.expand_bn(self.expand_conv(inputs), training=training))
        if self.strides == 2:
            x = ops.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]])
        x = ops.silu(self.depthwise_bn(self.depthwise_conv(x), training=training))
        x = self.project_bn(self.project_conv(x), training=training)
        # ops.add, not `+`: the QAT twin fake-quantizes the sum (the int8 ADD's output).
        return ops.add(inputs, x) if self.use_residual else x

    def compute_output_shape(self, input_shape):
        def out(size):
            return None if size is None else -(-size // self.strides)

        return (input_shape[0], out(input_shape[1]), out(input_shape[2]), self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "strides": self.strides,
                "expansion": self.expansion,
                "norm_epsilon": self.norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
