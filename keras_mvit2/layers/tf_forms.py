"""The TensorFlow-only steps of the shared transformer math, each behind one small function.

`keras_mvit2.layers.functional` writes the math in `keras.ops`; these are the steps that
have no `keras.ops` form converting to the same TFLite / Core ML program (a second
backend, e.g. torch, would provide its own version of each):

* `space_to_depth` / `depth_to_space`: SPACE_TO_DEPTH / DEPTH_TO_SPACE, no TRANSPOSE;
* `depthwise_patch_conv`: the unfold as a depthwise 0/1 convolution (Core ML);
* `conv1x1_nchw`: a 1x1 convolution of channels-first tensors, `Conv2D` + `BiasAdd` in
  NCHW (`keras.ops.conv(data_format="channels_first")` transposes on CPU TensorFlow);
* `matmul_transpose_a`: `a^T b` per sample as one BATCH_MATMUL with `adj_x`;
* `batch_size`: the runtime batch size (a dynamic-size unfold's reshape).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def space_to_depth(x: tf.Tensor, block_size: int) -> tf.Tensor:
    """`(B, H, W, C)` -> `(B, H / s, W / s, s * s * C)`, channel `(ph * s + pw) * C + c`."""
    return tf.nn.space_to_depth(x, block_size)


def depth_to_space(x: tf.Tensor, block_size: int) -> tf.Tensor:
    """`(B, h, w, s * s * C)` -> `(B, h * s, w * s, C)`; the inverse of `space_to_depth`."""
    return tf.nn.depth_to_space(x, block_size)


def depthwise_patch_conv(x: tf.Tensor, patch_size: int) -> tf.Tensor:
    """`(B, H, W, d)` -> `(B, H / p, W / p, d * P)` by a depthwise p x p, stride-p 0/1 kernel.

    Output channel `c * P + k` is pixel `k` (row-major) of the patch, channel `c`.
    """
    d, p = x.shape[3], patch_size
    area = p * p
    kernel = np.zeros((p, p, d, area), dtype=np.float32)
    for k in range(area):
        kernel[k // p, k % p, :, k] = 1.0
    return tf.nn.depthwise_conv2d(
        x, tf.constant(kernel, dtype=x.dtype), strides=[1, p, p, 1], padding="VALID"
    )


def conv1x1_nchw(x: tf.Tensor, kernel, bias=None) -> tf.Tensor:
    """A 1x1 convolution of channels-first `x` `(B, C, H, W)` with a Keras `(1, 1, C, O)` kernel.

    Returns:
        `(B, O, H, W)`.
    """
    y = tf.nn.conv2d(x, tf.cast(kernel, x.dtype), 1, "VALID", data_format="NCHW")
    if bias is not None:
        y = tf.nn.bias_add(y, tf.cast(bias, x.dtype), data_format="NCHW")
    return y


def matmul_transpose_a(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """`a^T b` per sample, `(B, K, M)` and `(B, K, N)` -> `(B, M, N)`: one BATCH_MATMUL."""
    return tf.linalg.matmul(a, b, adjoint_a=True)


def batch_size(x: tf.Tensor) -> tf.Tensor:
    """The batch size of `x` as a scalar int32 tensor (one Shape op, one slice)."""
    return tf.shape(x)[0]
