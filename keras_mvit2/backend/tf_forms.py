"""The TensorFlow-only steps of the layers, each behind one small function.

`keras_mvit2.layers.functional` and the layers write the math in `keras.ops`; these are
the steps that have no `keras.ops` form converting to the same TFLite / Core ML program.
The other backends (JAX, PyTorch) run `keras_mvit2.backend.ops_forms`, the same functions in
`keras.ops`; `keras_mvit2.backend.forms` picks one of the two modules, once:

* `space_to_depth` / `depth_to_space`: SPACE_TO_DEPTH / DEPTH_TO_SPACE, no TRANSPOSE;
* `depthwise_patch_conv`: the unfold as a depthwise 0/1 convolution (Core ML);
* `conv1x1_nchw`: a 1x1 convolution of channels-first tensors, `Conv2D` + `BiasAdd` in
  NCHW (`keras.ops.conv(data_format="channels_first")` transposes on CPU TensorFlow);
* `matmul_transpose_a` / `matmul_transpose_b`: `a^T b` / `a b^T` as one BATCH_MATMUL with
  `adj_x` / `adj_y`;
* `batch_size`: the runtime batch size (a dynamic-size unfold's reshape);
* `spatial_size` / `resize_when_different`: a map's height and width, static where known,
  and a resize decided at run time (`tf.cond`) for a dynamic one;
* `resize_bilinear`: RESIZE_BILINEAR with `align_corners` or half-pixel centers, to a
  static or a tensor size (`tf.raw_ops.ResizeBilinear`);
* `resize_shorter_side`: `tf.image.resize` to a size computed in the graph (the
  evaluation transform; `keras.ops.image.resize` takes only Python ints);
* `argsort_stable`: a stable argsort, ascending or descending (`keras.ops.argsort` is not
  stable on TensorFlow; the SSD loss's hard negative mining breaks ties by anchor index).

This module is imported only on the TensorFlow backend (and by TensorFlow-only code).
"""

from __future__ import annotations

import tensorflow as tf
from keras import ops

from keras_mvit2.backend.ops_forms import patch_pixel_kernel


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
    p = patch_size
    kernel = patch_pixel_kernel(x.shape[3], p)
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


def matmul_transpose_b(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """`a b^T` over the last two axes, `(..., M, K)` and `(..., N, K)` -> `(..., M, N)`: one
    BATCH_MATMUL (its second operand's adjoint flag, no TRANSPOSE)."""
    return tf.linalg.matmul(a, b, adjoint_b=True)


def batch_size(x: tf.Tensor) -> tf.Tensor:
    """The batch size of `x` as a scalar int32 tensor (one Shape op, one slice)."""
    return tf.shape(x)[0]


def spatial_size(x: tf.Tensor) -> tuple:
    """`(height, width)` of a `(batch, H, W, C)` tensor: ints where static, else scalar tensors."""
    height, width = x.shape[1], x.shape[2]
    if height is not None and width is not None:
        return height, width
    shape = tf.shape(x)
    return (shape[1] if height is None else height, shape[2] if width is None else width)


def resize_when_different(x: tf.Tensor, current: tuple, size: tuple, resize) -> tf.Tensor:
    """`resize(x, size)` when `current != size` at run time (a `tf.cond`), else `x`."""
    needs = tf.logical_or(tf.not_equal(current[0], size[0]), tf.not_equal(current[1], size[1]))
    return tf.cond(needs, lambda: resize(x, size), lambda: x)


def size_argument(size: tuple):
    """`size` for `tf.raw_ops.ResizeBilinear`: the ints as they are, or one int32 tensor."""
    if all(isinstance(side, int) for side in size):
        return size
    return tf.stack([tf.cast(side, tf.int32) for side in size])


def resize_bilinear(x: tf.Tensor, size: tuple, align_corners: bool) -> tf.Tensor:
    """Bilinear resize of `(B, H, W, C)` to `size` (ints or scalar tensors), no antialiasing.

    `align_corners=True`: output pixel `i` samples input `i * (in - 1) / (out - 1)`
    (PyTorch's `align_corners=True`); `False`: half-pixel centers (PyTorch's default).
    """
    resized = tf.raw_ops.ResizeBilinear(
        images=x, size=size_argument(size), align_corners=align_corners,
        half_pixel_centers=not align_corners,
    )
    return ops.cast(resized, x.dtype)


def argsort_stable(x: tf.Tensor, axis: int = -1, descending: bool = False) -> tf.Tensor:
    """The indices that sort `x` along `axis`; equal values keep their order (stable)."""
    return tf.argsort(x, axis=axis, direction="DESCENDING" if descending else "ASCENDING",
                      stable=True)


def resize_shorter_side(x: tf.Tensor, shape, target: float, interpolation: str,
                        antialias: bool, xp=ops) -> tuple:
    """Resize `(B, H, W, C)` so its shorter side is `target`, as torchvision's `Resize(int)`.

    `shape` is `keras.ops.shape(x)`. The longer side becomes `floor(target * long / short)`
    (float32). Returns `(resized, new_height, new_width)`, the sizes as int32 tensors.
    `xp`: the ops of the size arithmetic (`keras.ops`; Keras' TensorFlow backend inside
    tf.data on another backend: `EvalResizeCrop.in_tf_data`).
    """
    height = xp.cast(shape[1], "float32")
    width = xp.cast(shape[2], "float32")
    short = xp.minimum(height, width)
    # torchvision: the shorter side -> target, the longer -> int(target * long / short)
    new_h = xp.where(height <= width, target, xp.floor(target * height / short))
    new_w = xp.where(height <= width, xp.floor(target * width / short), target)
    new_h = xp.cast(new_h, "int32")
    new_w = xp.cast(new_w, "int32")
    # tf.image.resize, as keras.ops.image.resize on the TF backend, but it takes a
    # size tensor inside tf.function / tf.data / TFLite tracing (keras' checks
    # `size[0] <= 0` in Python, which a symbolic size cannot answer).
    x = tf.image.resize(x, tf.stack([new_h, new_w]), method=interpolation, antialias=antialias)
    return x, new_h, new_w
