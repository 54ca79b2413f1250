"""Separable self-attention (MobileViTv2, Mehta & Rastegari 2023, eq. 3)."""

from typing import ClassVar

import keras
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.layers import attention_registry, export_forms, functional
from keras_mvit2.layers.initializers import clone_initializer, conv_kernel_initializer

__all__ = [
    "SeparableSelfAttention",
    "exp_over_tokens",
    "pool_tokens",
    "softmax_over_tokens",
]


def exp_over_tokens(x):
    """`(exp(x - max), its sum)` over axis 1 (`keras_mvit2.layers.functional.exp_over_tokens`)."""
    return functional.exp_over_tokens(x, axis=1)


def softmax_over_tokens(x):
    """Softmax along axis 1, without a TRANSPOSE in TFLite (see `exp_over_tokens`)."""
    return functional.softmax_over_tokens(x, axis=1)


def pool_tokens(x, scores):
    """`sum_N(scores * x)` of `(B, N, P, d)` tokens and `(B, N, P, 1)` scores -> `(B, 1, P, d)`.

    The form is `export_forms.current().token_pooling` (see
    `keras_mvit2.layers.functional.pool_tokens`).
    """
    return functional.pool_tokens(x, scores, layout=functional.CHANNELS_LAST)


@attention_registry.register("separable", "separable_self_attention", "linear")
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
    P pixel positions of a patch. No token-by-token matrix, no heads, no scaling.
    The sum over tokens is one small matrix product per sample (`pool_tokens`),
    with `exp(q - max)` as weights and one division by their sum afterwards, so
    that full-int8 TFLite keeps it accurate at hundreds of tokens (see
    `pool_tokens`; the division is two products by the sum's `rsqrt`, which int8
    keeps accurate where one token takes the weight and never turns into a division
    by zero: `functional.divide_positive`); Core ML exports trace it as a
    product and a mean.

    The key projection is applied once, to the score-weighted tokens, rather than
    to every token: `sum_N(c_s * (W_k x + b_k)) = W_k sum_N(c_s * x) + b_k sum_N(c_s)`.
    This is the same function with the same weights (the reference's `qkv_proj`
    kernel, sliced), and a third fewer multiply-accumulates per token
    (1 + d outputs per token instead of 1 + 2d), which is what makes the layer
    3-6x faster than multi-head attention at 1024-2048 tokens in TFLite.

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

    #: Full-int8 TFLite: every op integer (the export contract).
    int8_float_ops: ClassVar[frozenset[str]] = frozenset()

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
        # (tokens, pixel positions) of the built input, for MAC accounting.
        self._token_grid = (input_shape[1], input_shape[2] if len(input_shape) == 4 else 1)
        shape4 = tuple(input_shape) if len(input_shape) == 4 else (
            input_shape[0], input_shape[1], 1, input_shape[2])
        def common():
            return dict(
                kernel_size=1,
                use_bias=self.use_bias,
                kernel_initializer=clone_initializer(self.kernel_initializer),
                bias_initializer=clone_initializer(self.bias_initializer),
                dtype=self.dtype_policy,
            )

        self.qkv_proj = keras.layers.Conv2D(1 + 2 * self.dim, name="qkv_proj", **common())
        self.qkv_proj.build(shape4)
        self.out_proj = keras.layers.Conv2D(self.dim, name="out_proj", **common())
        self.out_proj.build(shape4[:-1] + (self.dim,))
        self.score_dropout = keras.layers.Dropout(self.attn_dropout, dtype=self.dtype_policy)

    def key_projection_macs_saved(self) -> int | None:
        """MACs per sample that projecting the pooled tokens saves over projecting each token.

        The reference applies the key projection (d x d) to all N tokens of each of
        the P pixel positions; this layer applies it once per position. `None` when
        the token count is not static.
        """
        tokens, positions = self._token_grid
        if tokens is None or positions is None:
            return None
        return self.dim * self.dim * (tokens - 1) * positions

    def _projection(self, part: str, x):
        """`W x + b` with the query, key or value slice of the reference's `qkv_proj`."""
        d = self.dim
        outputs = {"query": (0, 1), "key": (1, 1 + d), "value": (1 + d, 1 + 2 * d)}[part]
        return functional.pointwise_conv(
            x, self.qkv_proj.kernel, self.qkv_proj.bias if self.use_bias else None,
            outputs=outputs,
        )

    def _query(self, x):
        return self._projection("query", x)                  # (B, N, P, 1)

    def _as_4d(self, inputs):
        if not self.built:
            self.build(tuple(inputs.shape))
        return inputs if len(inputs.shape) == 4 else ops.expand_dims(inputs, 2)

    def context_scores(self, inputs):
        """The context scores c_s, `(batch, num_tokens[, patch_area])`, summing to 1 over tokens."""
        scores = softmax_over_tokens(self._query(self._as_4d(inputs)))[..., 0]  # (B, N, P)
        return scores if len(inputs.shape) == 4 else scores[..., 0]

    def call(self, inputs, training=None):
        x = self._as_4d(inputs)                              # (B, N, P, d)
        # The math: keras_mvit2.layers.functional.separable_attention; its forms (the
        # token pooling and the score normaliser) are export_forms.current().
        out = functional.separable_attention(
            x, self.qkv_proj.kernel, self.qkv_proj.bias if self.use_bias else None,
            self.out_proj, layout=functional.CHANNELS_LAST, forms=export_forms.current(),
            dropout=lambda e: self.score_dropout(e, training=training),
            key_bias_correction=bool(self.use_bias and training and self.attn_dropout > 0),
        )                                                    # (B, N, P, d)
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
