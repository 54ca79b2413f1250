"""The standard augmentation and the evaluation transform in numpy and PIL (no TensorFlow).

The PyTorch backend's input (`keras_mvit2.data.py_dataset`) cannot use the tf.data
transforms of `keras_mvit2.data.augment`; these are the same transforms, drawn from numpy
generators:

- random resized crop: the box sampler of TensorFlow's `sample_distorted_bounding_box`
  (which `augment.sample_crop_box` calls) transcribed: aspect ratio (width / height)
  uniform in `ratio`, the height uniform among the integers whose area falls in `scale`,
  then the offsets, up to 10 attempts, else the whole image;
- crop, then resize with bilinear interpolation, antialiased when shrinking (PIL's
  `BILINEAR` on float32 planes: a triangle filter widened by the scale, the filter of
  `tf.image.resize(..., antialias=True)`), values scaled to [0, 1];
- horizontal flip with probability 0.5;
- evaluation: resize (aspect kept) to cover `floor(size / crop_ratio)`, center crop.

The same distributions as the tf.data pipeline, not the same draws: a run on PyTorch sees
other crops and flips than one on TensorFlow or JAX with the same seed; the same box gives
the same pixels within 4e-6 (docs/training.md).
"""

from __future__ import annotations

import math

import numpy as np

from keras_mvit2.data.augment_config import AugmentConfig


def to_rgb(image: np.ndarray) -> np.ndarray:
    """`(H, W, C)` with C in {1, 3, 4} -> `(H, W, 3)`: gray repeated, alpha dropped."""
    channels = image.shape[-1]
    if channels == 3:
        return image
    if channels == 1:
        return np.repeat(image, 3, axis=-1)
    if channels == 4:
        return image[..., :3]
    raise ValueError(f"Images must have 1, 3 or 4 channels. Received: shape={image.shape}")


def resize_to_float(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 `(h, w, C)` -> float32 `(height, width, C)` in [0, 1]: bilinear, antialiased
    when shrinking (each channel a PIL float32 plane, so nothing is rounded to uint8)."""
    from PIL import Image

    height, width = size
    planes = []
    for c in range(image.shape[-1]):
        plane = Image.fromarray(np.ascontiguousarray(image[..., c], dtype=np.float32), mode="F")
        planes.append(np.asarray(plane.resize((width, height), Image.BILINEAR)))
    out = np.stack(planes, axis=-1) * np.float32(1.0 / 255.0)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def sample_crop_box(
    height: int,
    width: int,
    rng: np.random.Generator,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    max_attempts: int = 10,
) -> tuple[int, int, int, int]:
    """An Inception-style crop box, TensorFlow's `sample_distorted_bounding_box` in numpy.

    Args:
        height: the image's height.
        width: the image's width.
        rng: the generator of the draws.
        scale: (min, max) area fraction of the crop.
        ratio: (min, max) width / height of the crop.

    Returns:
        `(offset_y, offset_x, crop_height, crop_width)`; the whole image after
        `max_attempts` misses.
    """
    min_area, max_area = scale[0] * width * height, scale[1] * width * height
    for _ in range(max_attempts):
        aspect = rng.uniform(ratio[0], ratio[1])
        box = _random_crop(height, width, min_area, max_area, aspect, rng)
        if box is not None:
            return box
    return 0, 0, height, width


def _random_crop(height: int, width: int, min_area: float, max_area: float, aspect: float,
                 rng: np.random.Generator) -> tuple[int, int, int, int] | None:
    """One attempt of TensorFlow's `GenerateRandomCrop` (its integer rounding kept)."""
    min_h = round(math.sqrt(min_area / aspect))
    max_h = round(math.sqrt(max_area / aspect))
    if round(max_h * aspect) > width:
        max_h = int((width + 0.5 - 1e-7) / aspect)
        if round(max_h * aspect) > width:
            max_h -= 1
    max_h = min(max_h, height)
    min_h = min(min_h, max_h)
    if min_h < max_h:
        min_h += int(rng.integers(0, max_h - min_h + 1))
    crop_h = min_h
    crop_w = round(crop_h * aspect)
    if crop_w * crop_h < min_area:
        crop_h += 1
        crop_w = round(crop_h * aspect)
    area = crop_w * crop_h
    if (area < min_area or area > max_area or crop_w > width or crop_h > height
            or crop_w <= 0 or crop_h <= 0):
        return None
    y = int(rng.integers(0, height - crop_h)) if crop_h < height else 0
    x = int(rng.integers(0, width - crop_w)) if crop_w < width else 0
    return y, x, crop_h, crop_w


def eval_transform(image: np.ndarray, size: tuple[int, int],
                   crop_ratio: float = 0.875) -> np.ndarray:
    """`keras_mvit2.data.eval_transform` in numpy: uint8 `(H, W, C)` -> float32
    `(height, width, 3)`: resize (aspect kept) to cover `floor(size / crop_ratio)`, then
    the central `size`."""
    image = to_rgb(image)
    out_h, out_w = size
    target_h = math.floor(out_h / crop_ratio)
    target_w = math.floor(out_w / crop_ratio)
    h, w = image.shape[:2]
    factor = max(target_h / h, target_w / w)
    new_h = max(round(h * factor), out_h)
    new_w = max(round(w * factor), out_w)
    resized = resize_to_float(image, (new_h, new_w))
    top, left = (new_h - out_h) // 2, (new_w - out_w) // 2
    return resized[top:top + out_h, left:left + out_w]


def check_supported(config: AugmentConfig, backend: str) -> None:
    """Raises a `ValueError` for augmentation this pipeline does not run (RandAugment,
    RandomErasing, CutMix / MixUp: Keras layers applied inside `tf.data`)."""
    unsupported = [name for name, on in (
        ("rand_augment", config.rand_augment),
        ("random_erasing", config.random_erasing > 0.0),
        ("mixup_alpha / cutmix_alpha", config.mixes_labels)) if on]
    if unsupported:
        raise ValueError(
            f"augment.{', augment.'.join(unsupported)} run in the tf.data pipeline only, "
            f"which the {backend!r} backend cannot load beside it. Train with "
            "KERAS_BACKEND=tensorflow or jax, or turn them off (--set "
            "augment.rand_augment=false --set augment.random_erasing=0 --set "
            "augment.mixup_alpha=0 --set augment.cutmix_alpha=0); the random resized crop "
            "and the flip run on every backend."
        )


def augment_example(image: np.ndarray, size: tuple[int, int], config: AugmentConfig,
                    rng: np.random.Generator) -> np.ndarray:
    """The standard training transform: uint8 `(H, W, C)` -> float32 `(height, width, 3)`
    in [0, 1]: random resized crop (or resize + center crop), then horizontal flip."""
    image = to_rgb(image)
    if config.random_resized_crop:
        oy, ox, h, w = sample_crop_box(image.shape[0], image.shape[1], rng,
                                       scale=config.rrc_scale, ratio=config.rrc_ratio)
        out = resize_to_float(image[oy:oy + h, ox:ox + w], size)
    else:
        out = eval_transform(image, size, crop_ratio=1.0)
    if config.horizontal_flip and rng.uniform() < 0.5:
        out = out[:, ::-1]
    return np.ascontiguousarray(out, dtype=np.float32)
