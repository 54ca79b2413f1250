"""Separable self-attention (MobileViTv2, Mehta & Rastegari 2023, eq. 3)."""

import keras
from keras import ops

from keras_mvit2 import attention
from keras_mvit2.api_export import serializable
from keras_mvit2.layers.initializers import conv_kernel_initializer


def softmax_over_tokens(x):
    """Softmax along axis 1 written as max / exp / sum / divide.

    TFLite's SOFTMAX only works on the last axis; this form keeps the token
    axis where it is, so the converted graph has no TRANSPOSE.
    """
    x = x - ops.max(x, axis=1, keepdims=True)
    e = ops.exp(x)
    return e / ops.sum(e, axis=1, keepdims=True)


@attention.register("separable", "separable_self_attention", "linear")
@serializable
class SeparableSelfAttention(keras.layers.Layer):
    """Separable self-attention with linear cost in the number of tokens.

    For tokens `x` (N of them, width d), as ml-cvnets' `LinearSelfAttention`:

    ```
    q, k, v = split(W_qkv x + b, [1, d, d])      # one 1x1 projection to 1 + 2d
    c_s = softmax(q) over the N tokens            # context scores, (N, 1)
    c_v = sum_N(c_s * k)                          # context vector, (1, d)
    y = W_o (ReLU(v) * c_v) + b_o                 # broadcast over N
    ```

    In the MobileViT layout the scores are computed separately for each of the
    P pixel positions of a patch. No matrix product, no heads, no scaling.

    Args:
        attn_dropout: float. Dropout on the context scores. Defaults to `0.0`.
        use_bias: bool. Biases in both projections. Defaults to `True`.
        kernel_initializer: initializer of both projection kernels. Defaults to
            He-normal with fan-out, as the reference.
        bias_initializer: initializer of both projection biases.

    Call arguments:
        inputs: tokens, see below.
        training: bool, enables the attention dropout.

    Input shape:
        `(batch, num_tokens, dim)` or the unfolded MobileViT layout
        `(batch, num_patches, patch_area, dim)`. Tokens are always on axis 1.

    Output shape:
        Same as the input.

    Example:
    >>> x = keras.random.normal((2, 64, 4, 32))
    >>> keras_mvit2.layers.SeparableSelfAttention()(x).shape
    (2, 64, 4, 32)

    Reference:
        Mehta & Rastegari, "Separable Self-attention for Mobile Vision
        Transformers", TMLR 2023, eq. (3).
    """

    def __init__(
        self,
        attn_dropout: float = 0.0,
        use_bias: bool = True,
        kernel_initializer=None,
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not 0.0 <= attn_dropout < 1.0:
            raise ValueError(
                f"attn_dropout must be in [0, 1). Received: attn_dropout={attn_dropout}"
            )
        self.attn_dropout = attn_dropout
        self.use_bias = use_bias
        self.kernel_initializer = conv_kernel_initializer(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, input_shape):
        if len(input_shape) not in (3, 4) or input_shape[-1] is None:
            raise ValueError(
                "SeparableSelfAttention expects (batch, tokens, dim) or "
                "(batch, patches, patch_area, dim) with a known dim. "
                f"Received: input_shape={input_shape}"
            )
        self.dim = int(input_shape[-1])
        shape4 = tuple(input_shape) if len(input_shape) == 4 else (
            input_shape[0], input_shape[1], 1, input_shape[2])
        common = dict(
            kernel_size=1,
            use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
        )
        self.qkv_proj = keras.layers.Conv2D(1 + 2 * self.dim, name="qkv_proj", **common)
        self.qkv_proj.build(shape4)
        self.out_proj = keras.layers.Conv2D(self.dim, name="out_proj", **common)
        self.out_proj.build(shape4[:-1] + (self.dim,))
        self.score_dropout = keras.layers.Dropout(self.attn_dropout, dtype=self.dtype_policy)

    def _project(self, inputs):
        x = inputs if len(inputs.shape) == 4 else ops.expand_dims(inputs, 2)
        qkv = self.qkv_proj(x)                              # (B, N, P, 1 + 2d)
        query = qkv[..., :1]                                # (B, N, P, 1)
        key = qkv[..., 1 : 1 + self.dim]                    # (B, N, P, d)
        value = qkv[..., 1 + self.dim :]                    # (B, N, P, d)
        return query, key, value

    def context_scores(self, inputs):
        """The context scores c_s, `(batch, num_tokens[, patch_area])`, summing to 1 over tokens."""
        if not self.built:
            self.build(tuple(inputs.shape))
        query, _, _ = self._project(inputs)
        scores = softmax_over_tokens(query)[..., 0]        # (B, N, P)
        return scores if len(inputs.shape) == 4 else scores[..., 0]

    def call(self, inputs, training=None):
        query, key, value = self._project(inputs)
        scores = softmax_over_tokens(query)                 # (B, N, P, 1)
        scores = self.score_dropout(scores, training=training)
        context = ops.sum(key * scores, axis=1, keepdims=True)  # (B, 1, P, d)
        out = self.out_proj(ops.relu(value) * context)      # (B, N, P, d)
        return out if len(inputs.shape) == 4 else ops.squeeze(out, 2)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "attn_dropout": self.attn_dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
