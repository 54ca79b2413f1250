"""Images for post-training quantization (representative datasets) and for validation.

`calibration_images` turns whatever the user has into a float32 array of images in
[0, 1] at the model's input size, ready for the TFLite converter's representative
dataset:

* a `tf.data.Dataset` yielding images, `(images, labels[, ...])` tuples or dicts with an
  ``"images"``/``"image"`` key, batched or not (e.g. the training or evaluation pipeline
  of `keras_mvit2.data`);
* a numpy array `(N, H, W, C)` (float in [0, 1] or uint8 in [0, 255], C in {1, 3});
* a folder with one sub-folder of images per class (`keras_mvit2.data.image_folder`);
* ``"fashion_mnist"`` (the Debian `dataset-fashion-mnist` files; ``"fashion_mnist:test"``
  for the test split).

Folders and Fashion-MNIST go through `keras_mvit2.data.make_eval_dataset` (resize so the
image covers ``size / crop_ratio``, center crop, RGB in [0, 1]) with a seeded shuffle, so
a subset mixes the classes. `load_labelled_images` reads such a source with its labels, for
`keras_mvit2.export.validate`.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_FOLDER_CROP_RATIO",
    "FASHION_MNIST",
    "LabelledImages",
    "calibration_images",
    "describe_source",
    "load_labelled_images",
]

#: The name that selects Fashion-MNIST (optionally ``"fashion_mnist:train"`` / ``":test"``).
FASHION_MNIST = "fashion_mnist"
#: Center-crop ratio for image folders (the ImageNet evaluation convention, 224 of 256).
DEFAULT_FOLDER_CROP_RATIO = 0.875
#: Tolerance on the [0, 1] range of float images (augmentations may overshoot slightly).
_RANGE_TOLERANCE = 0.05
_MIN_RECOMMENDED = 50


@dataclasses.dataclass
class LabelledImages:
    """Images with integer labels.

    Attributes:
        images: float32 `(N, H, W, 3)` in [0, 1].
        labels: int64 `(N,)`.
        class_names: names in label order.
        source: a description of where the images came from.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    source: str


def describe_source(data: Any) -> str:
    """A short description of a calibration / validation source, for metadata and reports."""
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    if isinstance(data, np.ndarray):
        return f"numpy array {tuple(data.shape)} {data.dtype}"
    return type(data).__name__


def calibration_images(
    data: Any,
    *,
    image_size: tuple[int, int],
    channels: int = 3,
    num_samples: int = 200,
    seed: int = 0,
    crop_ratio: float | None = None,
) -> np.ndarray:
    """Up to `num_samples` images from `data`, float32 `(n, H, W, channels)` in [0, 1].

    Args:
        data: a `tf.data.Dataset`, a numpy array, a folder path or ``"fashion_mnist"``
            (see the module docstring). Datasets are read in their own order (pass a
            shuffled one); arrays are subsampled at random (seeded); folders and
            Fashion-MNIST (train split by default) are shuffled (seeded).
        image_size: `(height, width)` of the model input.
        channels: channels of the model input (1-channel images are repeated to 3).
        num_samples: at most this many images.
        seed: seed of the subsampling / shuffle.
        crop_ratio: for folders and Fashion-MNIST, the center-crop ratio of the eval
            transform; default 0.875 for folders and 1.0 (no crop) for Fashion-MNIST.

    Returns:
        A float32 array of at least one image.

    Raises:
        ValueError: an unsupported type, images of another size than `image_size`,
            values outside [0, 1] (float) or no images at all.
        FileNotFoundError: a path that does not exist.
    """
    height, width = (int(d) for d in image_size)
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int. Received: {num_samples!r}")
    if isinstance(data, (str, os.PathLike)):
        loaded = load_labelled_images(
            data, image_size=(height, width), limit=num_samples, split="train", seed=seed,
            shuffle=True, crop_ratio=crop_ratio,
        )
        images = loaded.images
    elif isinstance(data, np.ndarray):
        images = _subsample(data, num_samples, seed)
        images = _normalize(images, (height, width), channels, "the representative array")
    elif _is_tf_dataset(data):
        images = _take_from_dataset(data, num_samples, (height, width), channels)
    else:
        raise ValueError(
            "representative_data must be a tf.data.Dataset of images, a numpy array "
            "(N, H, W, 3), a folder of class sub-folders of images, or 'fashion_mnist'. "
            f"Received: {type(data).__name__}"
        )
    if len(images) == 0:
        raise ValueError(
            f"representative_data ({describe_source(data)}) gave no images; calibration needs "
            "real images of the deployment distribution."
        )
    if len(images) < min(num_samples, _MIN_RECOMMENDED):
        warnings.warn(
            f"Calibrating on only {len(images)} images; activation ranges may be too narrow "
            f"and clip. {_MIN_RECOMMENDED}-500 images are recommended.",
            stacklevel=2,
        )
    return np.ascontiguousarray(images, dtype=np.float32)


def _is_tf_dataset(data: Any) -> bool:
    try:
        import tensorflow as tf
    except ImportError:  # pragma: no cover - TF is a dependency
        return False
    return isinstance(data, tf.data.Dataset)


def _subsample(images: np.ndarray, num_samples: int, seed: int) -> np.ndarray:
    if len(images) <= num_samples:
        return images
    rng = np.random.default_rng(seed)
    return images[np.sort(rng.choice(len(images), num_samples, replace=False))]


def _normalize(
    images: np.ndarray, image_size: tuple[int, int], channels: int, what: str
) -> np.ndarray:
    """uint8 -> /255, gray -> RGB, then checks the size and the [0, 1] range."""
    x = np.asarray(images)
    if x.ndim == 3 and channels != 1:
        x = x[..., None]
    if x.ndim != 4:
        raise ValueError(
            f"{what} must hold images (N, height, width, channels). Received: shape {x.shape}"
        )
    if x.shape[1:3] != tuple(image_size):
        raise ValueError(
            f"{what} has images of size {x.shape[1]}x{x.shape[2]} but the model takes "
            f"{image_size[0]}x{image_size[1]}. Fix: resize them first (e.g. "
            f"keras_mvit2.data.make_eval_dataset(source, image_size={tuple(image_size)}, ...))."
        )
    if x.shape[-1] == 1 and channels == 3:
        x = np.repeat(x, 3, axis=-1)
    if x.shape[-1] != channels:
        raise ValueError(
            f"{what} has {x.shape[-1]} channels but the model takes {channels}. "
            f"Received: shape {x.shape}"
        )
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(
            f"{what} must be float images in [0, 1] or uint8 pixels. Received: dtype {x.dtype}"
        )
    x = x.astype(np.float32)
    if x.size:
        lo, hi = float(np.min(x)), float(np.max(x))
        if lo < -_RANGE_TOLERANCE or hi > 1.0 + _RANGE_TOLERANCE:
            raise ValueError(
                f"{what} has values in [{lo:.3g}, {hi:.3g}], but keras_mvit2 models take RGB in "
                "[0, 1] (pixels / 255, see keras_mvit2.preprocess_input). Fix: divide uint8 "
                "pixel values by 255, or pass the uint8 images themselves."
            )
        if not np.all(np.isfinite(x)):
            raise ValueError(f"{what} contains NaN or inf values.")
    return x


def _element_images(element: Any) -> Any:
    if isinstance(element, dict):
        for key in ("images", "image", "pixel_values", "inputs", "x"):
            if key in element:
                return element[key]
        raise ValueError(
            "representative_data yields dicts without an image key ('images' or 'image'). "
            f"Received keys: {sorted(element)}"
        )
    if isinstance(element, (tuple, list)):
        if not element:
            raise ValueError("representative_data yields empty tuples.")
        return _element_images(element[0]) if isinstance(element[0], dict) else element[0]
    return element


def _take_from_dataset(
    dataset: Any, num_samples: int, image_size: tuple[int, int], channels: int
) -> np.ndarray:
    collected: list[np.ndarray] = []
    count = 0
    for element in dataset:
        x = np.asarray(_element_images(element))
        if x.ndim < 4:  # one image (H, W[, C])
            x = x[None]
        x = _normalize(x, image_size, channels, "representative_data (tf.data.Dataset)")
        collected.append(x[: num_samples - count])
        count += len(collected[-1])
        if count >= num_samples:
            break
    if not collected:
        return np.zeros((0, *image_size, channels), np.float32)
    return np.concatenate(collected, axis=0)


# --------------------------------------------------------------------------------------
# Folders and Fashion-MNIST (through keras_mvit2.data)


def _parse_fashion_mnist(spec: str, default_split: str) -> str | None:
    """``"fashion_mnist[:split]"`` -> split, or None for anything else."""
    name, _, split = spec.partition(":")
    if name.lower().replace("-", "_") != FASHION_MNIST:
        return None
    split = split or default_split
    if split not in ("train", "test"):
        raise ValueError(
            f"Fashion-MNIST split must be 'train' or 'test' (e.g. 'fashion_mnist:test'). "
            f"Received: {spec!r}"
        )
    return split


def load_labelled_images(
    data: Any,
    *,
    image_size: tuple[int, int],
    limit: int | None = None,
    split: str = "test",
    seed: int = 0,
    shuffle: bool = True,
    crop_ratio: float | None = None,
    batch_size: int = 64,
) -> LabelledImages:
    """Reads a folder of class sub-folders or Fashion-MNIST, with labels, at `image_size`.

    Args:
        data: a folder path (one sub-folder per class), ``"fashion_mnist"`` (optionally
            ``"fashion_mnist:train"`` / ``":test"``) or a `keras_mvit2.data.ImageSource`
            (e.g. the validation split of a folder, `training.make_sources`).
        image_size: `(height, width)` of the output images.
        limit: read at most this many images (default: all).
        split: the Fashion-MNIST split used when `data` names none (``"test"`` for
            validation, ``"train"`` for calibration).
        seed: shuffle seed.
        shuffle: shuffle before taking `limit` images (a class-mixed subset of a
            folder, which lists its images class by class). Fashion-MNIST's own order is
            already mixed: it is shuffled only for calibration (``split="train"``).
        crop_ratio: center-crop ratio of the eval transform; default 0.875 for folders
            and 1.0 for Fashion-MNIST (28x28 images with the object filling the frame).
        batch_size: read batch size.

    Returns:
        `LabelledImages` (float32 images in [0, 1], int64 labels).
    """
    from keras_mvit2.data import ImageSource, fashion_mnist, image_folder, make_eval_dataset

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None. Received: limit={limit!r}")

    spec = data.skipped.where if isinstance(data, ImageSource) else os.fspath(data)
    fm_split = None if isinstance(data, ImageSource) else _parse_fashion_mnist(spec, split)
    if isinstance(data, ImageSource):  # a split of a folder, say: read as it is
        source, description = data, spec
        ratio = DEFAULT_FOLDER_CROP_RATIO if crop_ratio is None else crop_ratio
    elif fm_split is not None:
        shuffle = shuffle and fm_split == "train"
        source = fashion_mnist(fm_split, limit=None if shuffle else limit)
        ratio = 1.0 if crop_ratio is None else crop_ratio
        description = f"{FASHION_MNIST}:{fm_split}"
    else:
        if not os.path.exists(spec):
            raise FileNotFoundError(
                f"Image data not found: {spec!r}. Pass a folder with one sub-folder of images "
                f"per class, or '{FASHION_MNIST}'."
            )
        source = image_folder(spec)
        ratio = DEFAULT_FOLDER_CROP_RATIO if crop_ratio is None else crop_ratio
        description = spec
    if shuffle:
        source = _shuffled(source, seed)
    dataset = make_eval_dataset(
        source,
        image_size=tuple(int(d) for d in image_size),
        batch_size=batch_size,
        num_classes=len(source.class_names),
        crop_ratio=ratio,
    )
    images: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    count = 0
    for x, y in dataset:
        images.append(np.asarray(x, np.float32))
        labels.append(np.argmax(np.asarray(y), axis=-1).astype(np.int64))
        count += len(images[-1])
        if limit is not None and count >= limit:
            break
    if source.skipped.count:
        warnings.warn(source.skipped.report(), stacklevel=2)
    if not images:
        raise ValueError(f"No readable images in {spec!r}.")
    all_images = np.concatenate(images)[:limit]
    all_labels = np.concatenate(labels)[:limit]
    return LabelledImages(all_images, all_labels, list(source.class_names), description)


def _shuffled(source: Any, seed: int) -> Any:
    """The same `ImageSource`, whose records come in a seeded shuffled order."""
    if source.make_records is not None:
        make_records = source.make_records
        return dataclasses.replace(
            source, make_records=lambda shuffle, unused_seed: make_records(True, seed)
        )
    buffer = max(1, min(int(source.num_examples), 10_000))
    return dataclasses.replace(
        source, dataset=source.dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=False)
    )
