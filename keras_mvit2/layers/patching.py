"""Unfold a feature map into patches and fold it back, transpose-free.

The MobileViT layout used throughout keras_mvit2 is `(batch, N, P, channels)`:
N = number of patches (row-major over the patch grid), P = pixels per patch
(row-major inside the patch). With channels-last data this is exactly
`space_to_depth` followed by a reshape, so neither direction needs a TRANSPOSE
and no tensor exceeds rank 4 (Core ML accepts rank <= 5, GPU delegates prefer 4).

Index mapping (the same as ml-cvnets' `F.unfold` path):
`unfolded[b, i * nw + j, ph * p + pw, c] = x[b, p * i + ph, p * j + pw, c]`.
"""

import tensorflow as tf


def unfold(x, patch_size: int = 2):
    """`(batch, H, W, C)` -> `(batch, (H/p) * (W/p), p * p, C)`.

    H and W must be static and divisible by `patch_size`.
    """
    height, width, channels = x.shape[1], x.shape[2], x.shape[3]
    if height is None or width is None or height % patch_size or width % patch_size:
        raise ValueError(
            f"unfold needs static height and width divisible by patch_size={patch_size}. "
            f"Received: shape={tuple(x.shape)}"
        )
    num_patches = (height // patch_size) * (width // patch_size)
    x = tf.nn.space_to_depth(x, patch_size)
    return tf.reshape(x, [-1, num_patches, patch_size * patch_size, channels])


def fold(x, grid_size: tuple[int, int], patch_size: int = 2):
    """`(batch, nh * nw, p * p, C)` -> `(batch, nh * p, nw * p, C)`; inverse of `unfold`."""
    rows, cols = grid_size
    channels = x.shape[-1]
    x = tf.reshape(x, [-1, rows, cols, patch_size * patch_size * channels])
    return tf.nn.depth_to_space(x, patch_size)
