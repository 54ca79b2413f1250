"""Group normalization with one group (GN1), the "layer_norm_2d" of ml-cvnets."""

import keras

from keras_mvit2.api_export import serializable
from keras_mvit2.layers import export_forms
from keras_mvit2.layers.functional import CHANNELS_LAST, group_norm1


@serializable
class GroupNorm1(keras.layers.Layer):
    """Group normalization with a single group, written for mobile export.

    Normalizes each sample with one mean and one variance taken over *all*
    non-batch axes (every position and every channel), then applies a
    per-channel scale and shift. This is `torch.nn.GroupNorm(1, C)`, which
    ml-cvnets calls "layer_norm_2d" and uses in every MobileViTv2 transformer
    layer. It is not a per-token LayerNorm.

    Unlike `keras.layers.GroupNormalization` it never reshapes to rank 5 and it
    uses only MEAN / SUB / MUL / RSQRT / ADD, which convert to TFLite builtins
    that are fully int8-quantizable. Under a mixed-precision policy the
    statistics are computed in float32. The variance is taken in one pass
    (E[x^2] - E[x]^2): it loses precision only when |mean| is hundreds of times
    the standard deviation, which normalized activations are not. The math is
    `keras_mvit2.layers.functional.group_norm1` (its form: `export_forms`).

    Args:
        epsilon: float. Added to the variance. Defaults to `1e-5` (the reference).
        gamma_initializer: initializer of the per-channel scale.
        beta_initializer: initializer of the per-channel shift.

    Input shape:
        `(batch, ..., channels)`, rank >= 2.

    Output shape:
        Same as the input.

    Example:
    >>> x = keras.random.normal((2, 16, 4, 8))
    >>> keras_mvit2.layers.GroupNorm1()(x).shape
    (2, 16, 4, 8)
    """

    def __init__(
        self,
        epsilon: float = 1e-5,
        gamma_initializer="ones",
        beta_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.epsilon = epsilon
        self.gamma_initializer = keras.initializers.get(gamma_initializer)
        self.beta_initializer = keras.initializers.get(beta_initializer)
        self.supports_masking = True

    def build(self, input_shape):
        if len(input_shape) < 2 or input_shape[-1] is None:
            raise ValueError(
                "GroupNorm1 needs an input of rank >= 2 with a known channel axis. "
                f"Received: input_shape={input_shape}"
            )
        channels = input_shape[-1]
        self.gamma = self.add_weight(
            shape=(channels,), initializer=self.gamma_initializer, name="gamma"
        )
        self.beta = self.add_weight(
            shape=(channels,), initializer=self.beta_initializer, name="beta"
        )

    def call(self, inputs):
        return group_norm1(
            inputs, self.gamma, self.beta, self.epsilon, layout=CHANNELS_LAST,
            variance=export_forms.current().variance, compute_dtype=self.compute_dtype,
        )

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "epsilon": self.epsilon,
                "gamma_initializer": keras.initializers.serialize(self.gamma_initializer),
                "beta_initializer": keras.initializers.serialize(self.beta_initializer),
            }
        )
        return config
