"""Separable self-attention (MobileViTv2, Mehta & Rastegari 2023, eq. 3)."""

import contextlib
import contextvars

import keras
import tensorflow as tf
from keras import ops

from keras_mvit2 import attention
from keras_mvit2.api_export import serializable
from keras_mvit2.layers.initializers import clone_initializer, conv_kernel_initializer


def _num_tokens(x):
    n = x.shape[1]
    return float(n) if n is not None else ops.cast(ops.shape(x)[1], x.dtype)


def exp_over_tokens(x):
    """Softmax along axis 1, unnormalised: `(exp(x - max), sum of it)` over the tokens.

    TFLite's SOFTMAX only works on the last axis; max / exp / mean keeps the token
    axis where it is, so the converted graph has no TRANSPOSE. The normaliser
    sum(e) is computed as mean(N * e): LiteRT's int16 SUM kernel is wrong and its
    MEAN is not (int16x8 models), and, unlike N * mean(e), the quantized tensor
    that int8 models divide by stays >= 1 (never rounds to zero).

    Returns:
        `e` with the shape of `x`, and its sum over axis 1 (kept, size 1).
    """
    e = ops.exp(x - ops.max(x, axis=1, keepdims=True))
    return e, ops.mean(e * _num_tokens(x), axis=1, keepdims=True)


def softmax_over_tokens(x):
    """Softmax along axis 1, without a TRANSPOSE in TFLite (see `exp_over_tokens`)."""
    e, total = exp_over_tokens(x)
    return e / total


_ELEMENTWISE_POOLING = contextvars.ContextVar("elementwise_token_pooling", default=False)


@contextlib.contextmanager
def elementwise_token_pooling():
    """Trace `pool_tokens` as a product and a mean instead of a matrix product.

    The same function; for exports whose runtime computes in float (Core ML: fp16 or
    fp32), where the matrix product only adds ops (9 `matmul` and 27 `reshape` in
    MobileViTV2-0.5) and the int8 rounding it avoids does not happen.
    """
    token = _ELEMENTWISE_POOLING.set(True)
    try:
        yield
    finally:
        _ELEMENTWISE_POOLING.reset(token)


def pool_tokens(x, scores):
    """`sum_N(scores * x)`: the weighted sum over the tokens of each pixel position.

    Written as one matrix product over the token axis, `scores^T x` per sample, not an
    element-wise product and a mean: in full-int8 TFLite the product `scores * x` is
    requantized to 8 bits before the sum, and at hundreds of tokens (256x256 input)
    its typical values (about |x| / N) fall under one quantization step, so most
    terms round to zero. A BATCH_MATMUL accumulates its int8 products in int32
    and rounds once. For P pixel positions the product computes all P x P
    (position, position) pairs and keeps the diagonal with a 0/1 mask, which needs
    no TRANSPOSE and costs P times the (small) multiply-accumulates of the sum.

    Args:
        x: `(batch, num_tokens, P, d)`.
        scores: `(batch, num_tokens, P, 1)`.

    Returns:
        `(batch, 1, P, d)`.
    """
    if _ELEMENTWISE_POOLING.get():
        return ops.mean(x * scores, axis=1, keepdims=True) * _num_tokens(x)
    positions, dim = x.shape[2], x.shape[3]
    tokens = ops.shape(x)[1]
    flat = ops.reshape(x, (-1, tokens, positions * dim))               # (B, N, P*d)
    pairs = tf.linalg.matmul(
        ops.reshape(scores, (-1, tokens, positions)), flat, adjoint_a=True
    )                                                                   # (B, P, P*d)
    if positions == 1:
        return ops.reshape(pairs, (-1, 1, 1, dim))
    pairs = ops.reshape(pairs, (-1, positions, positions, dim))       # (B, P, P, d)
    diagonal = ops.cast(ops.eye(positions)[:, :, None], pairs.dtype)   # (P, P, 1)
    # Mean of one non-zero term and P - 1 zeros, times P (see exp_over_tokens).
    return ops.mean(pairs * diagonal, axis=1, keepdims=True) * float(positions)


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
    P pixel positions of a patch. No token-by-token matrix, no heads, no scaling.
    The sum over tokens is one small matrix product per sample (`pool_tokens`),
    with `exp(q - max)` as weights and one division by their sum afterwards, so
    that full-int8 TFLite keeps it accurate at hundreds of tokens (see
    `pool_tokens`); Core ML exports trace it as a product and a mean.

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
        start, stop = {"query": (0, 1), "key": (1, 1 + d), "value": (1 + d, 1 + 2 * d)}[part]
        y = ops.conv(x, ops.cast(self.qkv_proj.kernel[..., start:stop], x.dtype))
        if self.use_bias:
            y = y + ops.cast(self.qkv_proj.bias[start:stop], x.dtype)
        return y

    def _query(self, x):
        return self._projection("query", x)                  # (B, N, P, 1)

    def _value(self, x):
        """ReLU(W_v x + b_v) as its own 1x1 conv, so converters fuse the ReLU into it.

        Slicing the value out of one [query | value] conv instead leaves a strided
        slice of the (B, N, P, d) tensor and a separate RELU, which int8 TFLite runs
        outside XNNPACK (MobileViTV2-0.5 int8: 6.1 -> 3.9 ms on one thread).
        """
        return ops.relu(self._projection("value", x))        # (B, N, P, d)

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
        # c_s = e / total. The weighted sum is taken with e and divided once by the
        # total, on the pooled (B, 1, P, d) tensor: in int8 TFLite the scores e / total
        # (about 1 / N each) would be rounded to 8 bits per token first.
        e, total = exp_over_tokens(self._query(x))          # (B, N, P, 1), (B, 1, P, 1)
        e = self.score_dropout(e, training=training)
        weighted = pool_tokens(x, e) / total                 # (B, 1, P, d)
        context = self._projection("key", weighted)          # (B, 1, P, d)
        if self.use_bias and training and self.attn_dropout > 0:
            # Dropped scores no longer sum to 1: scale the key bias by their sum.
            key_bias = ops.cast(self.qkv_proj.bias[1 : 1 + self.dim], x.dtype)
            kept = ops.sum(e, axis=1, keepdims=True) / total
            context = context + key_bias * (kept - 1.0)
        out = self.out_proj(self._value(x) * context)       # (B, N, P, d)
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
