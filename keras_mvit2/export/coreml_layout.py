"""The MobileViTv2 transformer written in Core ML's layout, for the Core ML export.

Core ML computes convolutions channels-first, `(B, C, H, W)`. coremltools converts a
channels-last TensorFlow graph by wrapping each convolution in layout transposes and then
cancelling the pairs that meet. In the MobileViTv2 block they cannot all meet: the unfold
ends in a reshape of the channels-last tensor `(B, N, P, d)`, so every 1x1 convolution of
the transformer keeps its transposes (MobileViTV2-0.5: 61 `transpose` ops).

`coreml_layout()` traces each `MobileViTV2Block` (separable attention) in the layout that
Core ML runs, with the tokens channels-first, `(B, d, P, N)`: P pixel positions as the
height axis and the N patches as the width axis, like ml-cvnets' own Core ML path. The
function and the weights are the same (checked against the Keras model in TensorFlow):

* unfold: a depthwise 2x2, stride-2 convolution with a 0/1 kernel and P outputs per
  channel (channel `c * P + k` is pixel `k` of the patch) and a reshape, no transpose;
* GN1: mean over `(d, P, N)`, centred variance, per-channel scale and shift;
* separable attention: the softmax over the tokens is a softmax over the last axis, the
  pooled context a product and a sum over it (float, as Core ML computes);
* fold: one transpose `(B, d, P, N) -> (B, P, d, N)`, a reshape and `depth_to_space`.

The rest of the model (convolutions, batch norms, inverted residuals) is traced as is.
Only inference calls are redirected; any other attention keeps the usual call.
"""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from keras_mvit2.layers.group_norm import GroupNorm1
from keras_mvit2.layers.mobilevitv2_block import MobileViTV2Block, export_call
from keras_mvit2.layers.separable_self_attention import SeparableSelfAttention
from keras_mvit2.layers.transformer_layer import TransformerLayer

__all__ = ["channels_first_block", "coreml_layout"]


@contextlib.contextmanager
def coreml_layout():
    """Within it, MobileViTV2 blocks trace their transformer in Core ML's layout."""
    with export_call(channels_first_block):
        yield


def _supported(block: MobileViTV2Block) -> bool:
    return all(
        isinstance(layer, TransformerLayer) and isinstance(layer.attn, SeparableSelfAttention)
        for layer in block.transformer
    )


def channels_first_block(block: MobileViTV2Block, inputs) -> tf.Tensor | None:
    """`block(inputs, training=False)` with the transformer channels-first; None if unsupported.

    Args:
        block: a built `MobileViTV2Block` whose transformer layers use separable attention.
        inputs: `(B, H, W, C)`, channels-last, as the block's call.

    Returns:
        `(B, H', W', C)` channels-last, the block's output.
    """
    if not _supported(block):
        return None
    p = block.patch_size
    x = block.resize_input(inputs)
    x = tf.nn.silu(block.local_bn(block.local_conv(x), training=False))
    x = block.local_proj(x)                                           # (B, H, W, d)
    rows, cols = x.shape[1] // p, x.shape[2] // p
    tokens = _unfold(x, p)                                            # (B, d, P, N)
    for layer in block.transformer:
        tokens = _transformer_layer(layer, tokens)
    tokens = _group_norm(block.norm, tokens)
    x = _fold(tokens, rows, cols, p)                                  # (B, H, W, d)
    return block.proj_bn(block.conv_proj(x), training=False)


def _unfold(x, p: int):
    """`(B, H, W, d)` -> `(B, d, P, N)` by a depthwise 0/1 convolution (no Core ML transpose)."""
    d = x.shape[3]
    area = p * p
    kernel = np.zeros((p, p, d, area), dtype=np.float32)
    for k in range(area):
        kernel[k // p, k % p, :, k] = 1.0                             # output channel c * P + k
    patches = tf.nn.depthwise_conv2d(
        x, tf.constant(kernel, dtype=x.dtype), strides=[1, p, p, 1], padding="VALID"
    )                                                                 # (B, rows, cols, d * P)
    rows, cols = patches.shape[1], patches.shape[2]
    patches = tf.transpose(patches, [0, 3, 1, 2])  # cancels Core ML's own layout change
    return tf.reshape(patches, [-1, d, area, rows * cols])


def _fold(tokens, rows: int, cols: int, p: int):
    """`(B, d, P, N)` -> `(B, rows * p, cols * p, d)`; the inverse of `_unfold`."""
    d, area = tokens.shape[1], tokens.shape[2]
    x = tf.transpose(tokens, [0, 2, 1, 3])                            # (B, P, d, N)
    x = tf.reshape(x, [-1, area * d, rows, cols])                     # channel k * d + c
    x = tf.transpose(x, [0, 2, 3, 1])  # cancels Core ML's own layout change
    return tf.nn.depth_to_space(x, p)


def _pointwise(x, kernel, bias=None):
    """A 1x1 convolution of channels-first `x` with a Keras `(1, 1, in, out)` kernel."""
    y = tf.nn.conv2d(x, tf.cast(kernel, x.dtype), 1, "VALID", data_format="NCHW")
    if bias is not None:
        y = tf.nn.bias_add(y, tf.cast(bias, x.dtype), data_format="NCHW")
    return y


def _per_channel(vector, dtype):
    return tf.reshape(tf.cast(vector, dtype), [1, -1, 1, 1])


def _group_norm(norm: GroupNorm1, x):
    """GN1 of channels-first `x`: one mean and variance over `(C, P, N)`, per-channel affine."""
    centred = x - tf.reduce_mean(x, axis=[1, 2, 3], keepdims=True)
    variance = tf.reduce_mean(tf.square(centred), axis=[1, 2, 3], keepdims=True)
    normalized = centred * tf.math.rsqrt(variance + norm.epsilon)
    return normalized * _per_channel(norm.gamma, x.dtype) + _per_channel(norm.beta, x.dtype)


def _attention(attn: SeparableSelfAttention, x):
    """Separable self-attention of channels-first tokens `(B, d, P, N)` (softmax over N)."""
    d = attn.dim
    kernel = attn.qkv_proj.kernel
    bias = attn.qkv_proj.bias if attn.use_bias else None

    def projection(start, stop, inputs):
        return _pointwise(inputs, kernel[..., start:stop],
                          None if bias is None else bias[start:stop])

    scores = tf.nn.softmax(projection(0, 1, x), axis=-1)              # (B, 1, P, N)
    pooled = tf.reduce_sum(x * scores, axis=-1, keepdims=True)        # (B, d, P, 1)
    context = projection(1, 1 + d, pooled)                            # (B, d, P, 1)
    value = tf.nn.relu(projection(1 + d, 1 + 2 * d, x))               # (B, d, P, N)
    out = attn.out_proj
    return _pointwise(value * context, out.kernel, out.bias if out.use_bias else None)


def _transformer_layer(layer: TransformerLayer, x):
    x = x + _attention(layer.attn, _group_norm(layer.norm1, x))
    y = tf.nn.silu(_pointwise(_group_norm(layer.norm2, x), layer.fc1.kernel, layer.fc1.bias))
    return x + _pointwise(y, layer.fc2.kernel, layer.fc2.bias)
