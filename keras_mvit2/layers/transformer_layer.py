"""The pre-norm transformer layer of MobileViTv2 (ml-cvnets' `LinearAttnFFN`)."""

import keras

from keras_mvit2.api_export import serializable
from keras_mvit2.layers import attention_registry
from keras_mvit2.layers.functional import transformer_layer
from keras_mvit2.layers.group_norm import GroupNorm1
from keras_mvit2.layers.initializers import clone_initializer, conv_kernel_initializer
from keras_mvit2.layers.stochastic_depth import StochasticDepth
from keras_mvit2.utils.arguments import validate_rates


def default_ffn_dim(dim: int, multiplier: float = 2.0) -> int:
    """The reference's FFN width: `multiplier * dim` floored to a multiple of 16."""
    return int((multiplier * dim) // 16 * 16)


@serializable
class TransformerLayer(keras.layers.Layer):
    """`x + Attn(GN1(x))`, then `x + FFN(GN1(x))`, on unfolded patches.

    GN1 is `GroupNorm1` (statistics over all patches, pixels and channels of a
    sample). The attention is `SeparableSelfAttention` unless `attention` names
    another mechanism of `keras_mvit2.attention`. The FFN is two 1x1
    convolutions `dim -> ffn_dim -> dim` with SiLU between them, i.e. a per-token
    MLP; 1x1 convolutions on a rank-4 tensor convert to TFLite CONV_2D, which
    XNNPACK runs fully.

    Args:
        attention: the token mixer: a name of `keras_mvit2.attention.available()`
            (e.g. `"mha"`), a config dict (`{"name": "mha", "num_heads": 4}`) or
            a layer (copied). Defaults to `"separable"`.
        ffn_dim: int. Hidden width of the FFN. Defaults to `2 * dim` floored to
            a multiple of 16, as the reference.
        attn_dropout: float. Dropout on the context scores.
        dropout: float. Dropout on the attention output and the FFN output.
        ffn_dropout: float. Dropout after the FFN activation.
        drop_path: float in [0, 1). Stochastic depth: probability of skipping
            each residual branch (attention, FFN) per sample during training
            (`StochasticDepth`). Defaults to `0.0` (the reference).
        norm_epsilon: float. GN1 epsilon. Defaults to `1e-5`.
        kernel_initializer: initializer of the FFN kernels. Defaults to
            He-normal with fan-out, as the reference (the attention layer uses
            its own default, the same for the separable attention).

    Input shape:
        `(batch, num_patches, patch_area, dim)`.

    Output shape:
        Same as the input.

    Example:
    >>> x = keras.random.normal((2, 64, 4, 32))
    >>> keras_mvit2.layers.TransformerLayer()(x).shape
    (2, 64, 4, 32)
    """

    def __init__(
        self,
        attention="separable",
        ffn_dim: int | None = None,
        attn_dropout: float = 0.0,
        dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        norm_epsilon: float = 1e-5,
        kernel_initializer=None,
        drop_path: float = 0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        validate_rates(attn_dropout=attn_dropout, dropout=dropout, ffn_dropout=ffn_dropout,
                       drop_path=drop_path)
        if ffn_dim is not None and ffn_dim <= 0:
            raise ValueError(f"ffn_dim must be positive. Received: ffn_dim={ffn_dim}")
        self.attention = attention
        self.ffn_dim = ffn_dim
        self.attn_dropout = attn_dropout
        self.dropout = dropout
        self.ffn_dropout = ffn_dropout
        self.norm_epsilon = norm_epsilon
        self.kernel_initializer = conv_kernel_initializer(kernel_initializer)
        self.drop_path = float(drop_path)

    def build(self, input_shape):
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(
                "TransformerLayer expects (batch, patches, patch_area, dim) with a known dim. "
                f"Received: input_shape={input_shape}"
            )
        dim = int(input_shape[-1])
        hidden = self.ffn_dim or default_ffn_dim(dim)
        policy = self.dtype_policy
        self.norm1 = GroupNorm1(self.norm_epsilon, name="norm1", dtype=policy)
        dropout = {"attn_dropout": self.attn_dropout} if self.attn_dropout else {}
        self.attn = attention_registry.get(self.attention, name="attn", dtype=policy, **dropout)
        self.norm2 = GroupNorm1(self.norm_epsilon, name="norm2", dtype=policy)
        self.fc1 = keras.layers.Conv2D(
            hidden, 1, kernel_initializer=clone_initializer(self.kernel_initializer),
            name="fc1", dtype=policy,
        )
        self.fc2 = keras.layers.Conv2D(
            dim, 1, kernel_initializer=clone_initializer(self.kernel_initializer),
            name="fc2", dtype=policy,
        )
        self.ffn_drop = keras.layers.Dropout(self.ffn_dropout, dtype=policy)
        self.out_drop = keras.layers.Dropout(self.dropout, dtype=policy)
        self.attn_drop_path = StochasticDepth(self.drop_path, name="attn_drop_path", dtype=policy)
        self.ffn_drop_path = StochasticDepth(self.drop_path, name="ffn_drop_path", dtype=policy)
        for layer in (self.norm1, self.attn, self.norm2, self.fc1):
            layer.build(input_shape)
        self.fc2.build(tuple(input_shape[:-1]) + (hidden,))

    def call(self, inputs, training=None):
        def dropped(drop_path):
            def wrap(y):                                              # (B, N, P, d)
                return drop_path(self.out_drop(y, training=training), training=training)
            return wrap

        return transformer_layer(
            inputs,
            norm1=self.norm1,
            attention=lambda t: self.attn(t, training=training),
            norm2=self.norm2,
            fc1=self.fc1,                                             # (B, N, P, ffn)
            fc2=self.fc2,
            attention_output=dropped(self.attn_drop_path),
            hidden=lambda y: self.ffn_drop(y, training=training),
            ffn_output=dropped(self.ffn_drop_path),
        )

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "attention": attention_registry.serialize(self.attention),
                "ffn_dim": self.ffn_dim,
                "attn_dropout": self.attn_dropout,
                "dropout": self.dropout,
                "ffn_dropout": self.ffn_dropout,
                "norm_epsilon": self.norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "drop_path": self.drop_path,
            }
        )
        return config
