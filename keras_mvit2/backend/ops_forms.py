"""`keras.ops` forms of the TensorFlow-only steps (`keras_mvit2.backend.tf_forms`).

The same functions, with the same arguments and results, for the backends that are not
TensorFlow (JAX, PyTorch); `keras_mvit2.backend.forms` picks this module there. Each
function computes what its TensorFlow twin computes (the same index orders, the same
interpolation weights in float32), so the layers give the same outputs on every backend.

On these backends a tensor's shape is known whenever a layer runs (JAX traces with
concrete shapes, PyTorch runs eagerly; Keras' symbolic build gives both concrete sample
sizes), so sizes are Python ints here: the patch grid, the resize decisions and the
interpolation weights are computed in Python, once per traced shape.

This module imports neither TensorFlow nor any other backend.
"""

from __future__ import annotations

import math

import numpy as np
from keras import ops

__all__ = [
    "argsort_stable",
    "batch_size",
    "conv1x1_nchw",
    "depth_to_space",
    "depthwise_patch_conv",
    "matmul_transpose_a",
    "matmul_transpose_b",
    "resize_bilinear",
    "resize_shorter_side",
    "resize_when_different",
    "space_to_depth",
    "spatial_size",
]


def space_to_depth(x, block_size: int):
    """`(B, H, W, C)` -> `(B, H / s, W / s, s * s * C)`, channel `(ph * s + pw) * C + c`."""
    _, height, width, channels = ops.shape(x)
    s = block_size
    x = ops.reshape(x, (-1, height // s, s, width // s, s, channels))
    x = ops.transpose(x, (0, 1, 3, 2, 4, 5))                  # (B, h, w, s, s, C)
    return ops.reshape(x, (-1, height // s, width // s, s * s * channels))


def depth_to_space(x, block_size: int):
    """`(B, h, w, s * s * C)` -> `(B, h * s, w * s, C)`; the inverse of `space_to_depth`."""
    _, rows, cols, depth = ops.shape(x)
    s = block_size
    channels = depth // (s * s)
    x = ops.reshape(x, (-1, rows, cols, s, s, channels))
    x = ops.transpose(x, (0, 1, 3, 2, 4, 5))                  # (B, h, s, w, s, C)
    return ops.reshape(x, (-1, rows * s, cols * s, channels))


def depthwise_patch_conv(x, patch_size: int):
    """`(B, H, W, d)` -> `(B, H / p, W / p, d * P)` by a depthwise p x p, stride-p 0/1 kernel.

    Output channel `c * P + k` is pixel `k` (row-major) of the patch, channel `c`.
    """
    kernel = patch_pixel_kernel(x.shape[3], patch_size)
    return ops.depthwise_conv(x, ops.cast(kernel, x.dtype), strides=patch_size,
                              padding="valid")


def patch_pixel_kernel(channels: int, patch_size: int) -> np.ndarray:
    """The 0/1 depthwise kernel `(p, p, channels, p * p)` of `depthwise_patch_conv`:
    multiplier `k` picks pixel `k` (row-major) of the patch (shared with `tf_forms`)."""
    p = patch_size
    kernel = np.zeros((p, p, channels, p * p), dtype=np.float32)
    for k in range(p * p):
        kernel[k // p, k % p, :, k] = 1.0
    return kernel


def conv1x1_nchw(x, kernel, bias=None):
    """A 1x1 convolution of channels-first `x` `(B, C, H, W)` with a Keras `(1, 1, C, O)` kernel.

    Returns:
        `(B, O, H, W)`.
    """
    y = ops.conv(x, ops.cast(kernel, x.dtype), data_format="channels_first")
    if bias is not None:
        y = y + ops.reshape(ops.cast(bias, x.dtype), (1, -1, 1, 1))
    return y


def matmul_transpose_a(a, b):
    """`a^T b` per sample, `(B, K, M)` and `(B, K, N)` -> `(B, M, N)`."""
    return ops.matmul(ops.transpose(a, (0, 2, 1)), b)


def matmul_transpose_b(a, b):
    """`a b^T` over the last two axes, `(..., M, K)` and `(..., N, K)` -> `(..., M, N)`."""
    return ops.matmul(a, ops.swapaxes(b, -1, -2))


def batch_size(x):
    """The batch size of `x` (an int on these backends)."""
    return ops.shape(x)[0]


def spatial_size(x) -> tuple:
    """`(height, width)` of a `(batch, H, W, C)` tensor: ints where static, else scalars."""
    height, width = x.shape[1], x.shape[2]
    if height is not None and width is not None:
        return height, width
    shape = ops.shape(x)
    return (shape[1] if height is None else height, shape[2] if width is None else width)


def resize_when_different(x, current: tuple, size: tuple, resize):
    """`resize(x, size)` when `current != size` at run time (`keras.ops.cond`), else `x`."""
    needs = ops.logical_or(ops.not_equal(current[0], size[0]), ops.not_equal(current[1], size[1]))
    return ops.cond(needs, lambda: resize(x, size), lambda: x)


def _interpolation(n_in: int, n_out: int, align_corners: bool):
    """Source rows `lower`, `upper` and the weight of `upper` for each of `n_out` outputs.

    TensorFlow's ResizeBilinear (and PyTorch's `F.interpolate`): the scale in float32,
    `lerp = src - floor(src)`, the indices clamped to the input.
    """
    out = np.arange(n_out, dtype=np.float32)
    if align_corners:
        scale = np.float32(n_in - 1) / np.float32(n_out - 1) if n_out > 1 else np.float32(0.0)
        src = out * scale
    else:
        scale = np.float32(n_in) / np.float32(n_out)
        src = (out + np.float32(0.5)) * scale - np.float32(0.5)
    floor = np.floor(src)
    lower = np.clip(floor, 0, n_in - 1).astype(np.int32)
    upper = np.clip(np.ceil(src), 0, n_in - 1).astype(np.int32)
    return lower, upper, (src - floor).astype(np.float32)


def _lerp_axis(x, n_out: int, axis: int, align_corners: bool):
    n_in = x.shape[axis]
    if n_in == n_out:
        return x
    lower, upper, lerp = _interpolation(n_in, n_out, align_corners)
    shape = [1, 1, 1, 1]
    shape[axis] = n_out
    lerp = ops.cast(np.reshape(lerp, shape), x.dtype)
    first = ops.take(x, lower, axis=axis)
    return first + (ops.take(x, upper, axis=axis) - first) * lerp


def resize_bilinear(x, size: tuple, align_corners: bool):
    """Bilinear resize of `(B, H, W, C)` to `size` (ints), no antialiasing.

    `align_corners=True`: output pixel `i` samples input `i * (in - 1) / (out - 1)`
    (PyTorch's `align_corners=True`); `False`: half-pixel centers (PyTorch's default).
    As TensorFlow's ResizeBilinear: along the width, then along the height.
    """
    height, width = (int(side) for side in size)
    x = _lerp_axis(x, width, 2, align_corners)
    return _lerp_axis(x, height, 1, align_corners)


def argsort_stable(x, axis: int = -1, descending: bool = False):
    """The indices that sort `x` along `axis`; equal values keep their order (stable).

    `keras.ops.argsort` is stable on JAX and PyTorch; descending sorts `-x` ascending, which
    keeps equal values in index order as TensorFlow's stable descending sort does.
    """
    return ops.argsort(ops.negative(x) if descending else x, axis=axis)


def resize_shorter_side(x, shape, target: float, interpolation: str,
                        antialias: bool) -> tuple:
    """Resize `(B, H, W, C)` so its shorter side is `target`, as torchvision's `Resize(int)`.

    `shape` is `keras.ops.shape(x)`. The longer side becomes `floor(target * long / short)`,
    computed in float32 as on TensorFlow. Returns `(resized, new_height, new_width)`, the
    sizes as ints. `keras.ops.image.resize`'s antialiased kernels are the backend's own
    (within 5e-5 of TensorFlow's on [0, 1] images, 400x300 -> 288 -> 256 bicubic).
    """
    height, width = np.float32(shape[1]), np.float32(shape[2])
    short = min(height, width)
    target32 = np.float32(target)
    new_h = target32 if height <= width else np.floor(target32 * height / short)
    new_w = np.floor(target32 * width / short) if height <= width else target32
    new_h, new_w = math.floor(new_h), math.floor(new_w)
    x = ops.image.resize(x, (new_h, new_w), interpolation=interpolation, antialias=antialias)
    return x, new_h, new_w
