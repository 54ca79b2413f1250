"""Batch arithmetic of a run, shared by every input pipeline (no TensorFlow): full
batches per epoch, and the (size, batch) pairs of multi-scale training (ml-cvnets'
variable batch sampler)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

DEFAULT_SCALES = (0.625, 0.75, 1.0, 1.125, 1.25)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")
    return value


def to_size(image_size: int | Sequence[int]) -> tuple[int, int]:
    """`image_size` (int or (height, width)) as a (height, width) pair of positive ints."""
    size = (image_size, image_size) if isinstance(image_size, int) else image_size
    if (
        isinstance(image_size, bool)
        or not isinstance(size, (tuple, list))
        or len(size) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)
    ):
        raise ValueError(
            "`image_size` must be a positive int or a (height, width) pair of positive ints. "
            f"Received: image_size={image_size!r}"
        )
    return int(size[0]), int(size[1])


def _num_classes(class_names: Sequence[str], num_classes: Any) -> int:
    """`num_classes` checked: a positive int, at least the source's number of classes."""
    num_classes, known = _positive_int("num_classes", num_classes), len(class_names or ())
    if num_classes < known:
        raise ValueError(
            f"The source has {known} classes but num_classes={num_classes}; "
            f"pass num_classes >= {known}. Received: num_classes={num_classes}"
        )
    return num_classes


def _make_divisible(value: float, divisor: int) -> int:
    """Nearest multiple of `divisor` (at least `divisor`, and not below 90% of `value`)."""
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if new < 0.9 * value:
        new += divisor
    return new


def multiscale_batch_pairs(
    base_size: int,
    base_batch_size: int,
    scales: Sequence[float] = DEFAULT_SCALES,
    *,
    size_divisor: int = 32,
    batch_multiple: int = 1,
) -> list[tuple[int, int]]:
    """The (image size, batch size) pairs of a multi-scale schedule, sorted by size.

    Rule (ml-cvnets' `image_batch_pairs`): each size is `base_size * scale` rounded to the
    nearest multiple of `size_divisor` (never below 90% of the exact value); the base size
    is always included. Each batch size is `floor(base_batch_size * (base_size / size)**2)`,
    so that a batch never holds more pixels than the base batch (`batch * size**2 <=
    base_batch_size * base_size**2 < (batch + 1) * size**2`: memory stays constant), then
    rounded down to a multiple of `batch_multiple` (e.g. the number of replicas), at least
    `batch_multiple`.

    With the defaults and base 256 / batch 128 (the paper's setting):
    `[(160, 327), (192, 227), (256, 128), (288, 101), (320, 81)]`.
    """
    base_size = _positive_int("base_size", base_size)
    base_batch_size = _positive_int("base_batch_size", base_batch_size)
    size_divisor = _positive_int("size_divisor", size_divisor)
    batch_multiple = _positive_int("batch_multiple", batch_multiple)
    if base_size % size_divisor:
        raise ValueError(
            f"`base_size` must be a multiple of size_divisor={size_divisor}. "
            f"Received: base_size={base_size}"
        )
    if (
        not isinstance(scales, (tuple, list))
        or not scales
        or not all(
            isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0 for s in scales
        )
    ):
        raise ValueError(
            f"`scales` must be a non-empty sequence of positive factors of base_size. "
            f"Received: scales={scales!r}"
        )
    sizes = sorted({_make_divisible(base_size * s, size_divisor) for s in scales} | {base_size})
    pixels = base_batch_size * base_size * base_size
    pairs = []
    for size in sizes:
        batch = pixels // (size * size)
        batch = max(batch_multiple, batch // batch_multiple * batch_multiple)
        pairs.append((size, batch))
    return pairs


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    """Full batches in one pass over `num_examples` (training drops the remainder)."""
    return max(0, num_examples // batch_size)


def multiscale_steps_per_epoch(num_examples: int, pairs: Sequence[tuple[int, int]]) -> int:
    """Expected number of batches in one multi-scale epoch: `num_examples / mean(batch)`."""
    mean_batch = sum(b for _, b in pairs) / len(pairs)
    return max(1, math.floor(num_examples / mean_batch))
