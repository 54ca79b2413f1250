"""Unfold a feature map into patches and fold it back, transpose-free.

The MobileViT layout used throughout keras_mvit2 is `(batch, N, P, channels)`:
N = number of patches (row-major over the patch grid), P = pixels per patch
(row-major inside the patch). With channels-last data this is exactly
`space_to_depth` followed by a reshape, so neither direction needs a TRANSPOSE
and no tensor exceeds rank 4 (Core ML accepts rank <= 5, GPU delegates prefer 4).

Index mapping (the same as ml-cvnets' `F.unfold` path):
`unfolded[b, i * nw + j, ph * p + pw, c] = x[b, p * i + ph, p * j + pw, c]`.

The patch grid is read from the tensor each call: a static height and width give
a reshape to constant sizes (the graph exported to TFLite / Core ML), an unknown
one (a model built with `input_shape=(None, None, 3)` and traced for any size)
a reshape whose patch count is computed from the tensor's runtime shape.
"""

from keras_mvit2.backend import forms as backend_forms
from keras_mvit2.layers import functional


def unfold(x, patch_size: int = 2):
    """`(batch, H, W, C)` -> `(batch, (H/p) * (W/p), p * p, C)`.

    H and W must be divisible by `patch_size` (checked when they are static). The
    space_to_depth form of `keras_mvit2.layers.functional.unfold`.
    """
    return functional.unfold(x, patch_size, layout=functional.CHANNELS_LAST,
                             form="space_to_depth")


def fold(x, grid_size, patch_size: int = 2):
    """`(batch, nh * nw, p * p, C)` -> `(batch, nh * p, nw * p, C)`; inverse of `unfold`.

    `grid_size` is `(nh, nw)`: ints, or scalar int tensors for a dynamic grid.
    """
    return functional.fold(x, grid_size, patch_size, layout=functional.CHANNELS_LAST)


def spatial_size(x) -> tuple:
    """`(height, width)` of a `(batch, H, W, C)` tensor: ints where static, else scalar tensors."""
    return backend_forms.spatial_size(x)


def round_up_to_patch(size, patch_size: int) -> tuple:
    """Each side of `size` (ints or scalar tensors) rounded up to a multiple of `patch_size`."""
    return tuple((side + (patch_size - 1)) // patch_size * patch_size for side in size)


def resize_if_needed(x, size, resize):
    """`resize(x, size)` unless `x` already is `size` (`(height, width)`, ints or tensors).

    Decided when tracing where both sizes are static (then no op is added when they are
    equal), else at run time with a `cond`, so an even map of a dynamic-size model
    is passed through untouched, exactly as in a model built for that size.
    """
    current = spatial_size(x)
    static = [isinstance(a, int) and isinstance(b, int) for a, b in zip(current, size, strict=True)]
    if all(static):
        return x if tuple(current) == tuple(size) else resize(x, size)
    if any(s and a != b for s, a, b in zip(static, current, size, strict=True)):
        return resize(x, size)  # a static side differs: resized for every input
    return backend_forms.resize_when_different(x, current, size, resize)
