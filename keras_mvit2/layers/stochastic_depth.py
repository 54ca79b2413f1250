"""Stochastic depth ("drop path", Huang et al. 2016) on a residual branch."""

import keras
from keras import ops

from keras_mvit2.api_export import serializable


@serializable
class StochasticDepth(keras.layers.Layer):
    """Drops a whole residual branch per sample during training.

    In training, each sample's branch output is kept with probability
    `1 - rate` and scaled by `1 / (1 - rate)`, or zeroed (timm's `DropPath`);
    the residual `x + StochasticDepth(rate)(branch)` then skips the branch for
    that sample. At inference (or `rate == 0`) it is the identity, so it adds
    no op to exported graphs.

    Args:
        rate: float in [0, 1). Probability of dropping the branch of a sample.
        seed: optional int. Seed of the layer's `keras.random.SeedGenerator`
            (its state advances every training call; `keras.utils.set_random_seed`
            makes the unseeded default reproducible).

    Call arguments:
        inputs: the branch output, `(batch, ...)`.
        training: bool. Drop only when `True`.

    Input shape:
        `(batch, ...)`, any rank >= 1.

    Output shape:
        Same as the input.

    Example:
    >>> x = keras.ops.ones((4, 8, 2, 16))
    >>> y = keras_mvit2.layers.StochasticDepth(0.5, seed=1)(x, training=True)
    >>> y.shape  # each sample's values are now all 0.0 or all 2.0
    (4, 8, 2, 16)
    """

    def __init__(self, rate: float = 0.0, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"rate must be in [0, 1). Received: rate={rate}")
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed) if self.rate > 0 else None
        self.supports_masking = True

    def call(self, inputs, training=None):
        if not training or self.rate == 0.0:
            return inputs
        keep = 1.0 - self.rate
        # One Bernoulli draw per sample, broadcast over the other axes.
        shape = (ops.shape(inputs)[0],) + (1,) * (len(inputs.shape) - 1)
        mask = keras.random.uniform(shape, seed=self.seed_generator, dtype=inputs.dtype)
        mask = ops.floor(mask + ops.cast(keep, inputs.dtype))        # 1 with probability keep
        return inputs * mask / ops.cast(keep, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "seed": self.seed})
        return config
