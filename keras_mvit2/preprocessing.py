"""The checkpoints' own evaluation transform for photos: `preprocess_images` and the
Keras model doing the same (`preprocessing_model`), to put in front of the network.

MobileViTv2's ImageNet checkpoints take RGB in [0, 1] with no mean/std; the 256x256
ones are evaluated with the shorter side resized to 288 (bicubic) and a 256 center
crop, the 384x384 fine-tunes with a 384 resize and no crop (crop_pct 1.0). Sources in
docs/pretrained.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import keras
import numpy as np

from keras_mvit2.layers.eval_resize_crop import EvalResizeCrop

__all__ = ["eval_transform", "load_image", "preprocess_images", "preprocessing_model"]

#: timm's crop_pct of the 256x256 checkpoints (256 / 0.888 -> shorter side 288).
DEFAULT_CROP_PCT = 0.888


def eval_transform(model: keras.Model | int | None = None,
                   crop_pct: float | None = None) -> tuple[int, float]:
    """`(size, crop_pct)` of the evaluation transform for `model`.

    A model built with `weights=<tag>` uses its checkpoint's; otherwise the size is the
    model's (square) input size, or `model` itself when an int (default 256), and
    `crop_pct` is 1.0 at 384 (the `_384` checkpoints) and 0.888 otherwise.
    """
    entry = getattr(model, "_keras_mvit2_weights", None)
    if entry is not None:
        return entry.input_size, entry.crop_pct if crop_pct is None else crop_pct
    if model is None:
        size = 256
    elif isinstance(model, int) and not isinstance(model, bool):
        size = model
    elif isinstance(model, keras.Model):
        shape = tuple(model.input_shape[1:3])
        if shape[0] is None or shape[0] != shape[1]:
            raise ValueError(
                "preprocess_images needs a model with a square, fixed input size, or pass "
                f"the size as an int. Received a model with input_shape={model.input_shape}"
            )
        size = int(shape[0])
    else:
        raise ValueError(
            "model must be a keras.Model, an int size or None. Received: "
            f"{type(model).__name__}"
        )
    if crop_pct is None:
        crop_pct = 1.0 if size == 384 else DEFAULT_CROP_PCT
    return size, crop_pct


def preprocessing_model(
    model: keras.Model | int | None = None,
    crop_pct: float | None = None,
    input_shape: tuple[int | None, int | None, int] = (None, None, 3),
    interpolation: str = "bicubic",
) -> keras.Model:
    """A Keras model: RGB images in [0, 255] -> the network's input (the checkpoint's
    evaluation transform, see `EvalResizeCrop`).

    Put it in front of the network to classify raw photos in one model:
    `keras.Sequential([preprocessing_model(net), net])`. Bicubic resizing with
    antialiasing has no TFLite builtin op; for a TFLite file export the network alone
    (and resize in the app) or pass `interpolation="bilinear"` with a fixed
    `input_shape`.

    Args:
        model: the network (its checkpoint or input size picks the transform), an int
            size, or None (256).
        crop_pct: override of the center-crop fraction.
        input_shape: the photos' shape; `(None, None, 3)` takes any size.
        interpolation: resize interpolation (`"bicubic"`: the checkpoints').
    """
    size, crop = eval_transform(model, crop_pct)
    inputs = keras.Input(shape=input_shape, name="photo")
    outputs = EvalResizeCrop(size, crop, interpolation=interpolation, name="eval_resize_crop")(
        inputs)
    return keras.Model(inputs, outputs, name="preprocessing")


def load_image(image: Any) -> np.ndarray:
    """One image as a uint8 RGB array `(H, W, 3)`.

    Accepts a file path, a PIL image (any mode; converted to RGB), or a uint8 numpy
    array / tensor `(H, W)`, `(H, W, 1)`, `(H, W, 3)` or `(H, W, 4)` (alpha dropped).
    """
    if isinstance(image, str | os.PathLike):
        from PIL import Image

        path = os.fspath(image)
        if not os.path.exists(path):
            raise FileNotFoundError(f"Image file not found: {path!r}")
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    if type(image).__module__.startswith("PIL."):
        return np.asarray(image.convert("RGB"))
    array = np.asarray(image)
    if array.dtype != np.uint8:
        raise ValueError(
            "Image arrays must be uint8 RGB in [0, 255] (as decoded from a file); convert "
            "floats with (x * 255).round().astype('uint8') if they are in [0, 1]. Received: "
            f"dtype={array.dtype}"
        )
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
        raise ValueError(
            "An image array must be (H, W), (H, W, 1), (H, W, 3) or (H, W, 4). "
            f"Received: shape={array.shape}"
        )
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    return array[..., :3]


def _as_list(images: Any) -> list:
    if isinstance(images, str | os.PathLike) or type(images).__module__.startswith("PIL."):
        return [images]
    if hasattr(images, "shape") and hasattr(images, "dtype"):
        array = np.asarray(images)
        return list(array) if array.ndim == 4 else [array]
    if isinstance(images, Iterable):
        return list(images)
    raise ValueError(
        "images must be a path, a PIL image, an array / tensor or a list of them. "
        f"Received: {type(images).__name__}"
    )


def preprocess_images(
    images: Any,
    model: keras.Model | int | None = None,
    *,
    crop_pct: float | None = None,
) -> np.ndarray:
    """Photos -> a batch for the model, with the checkpoint's own evaluation transform.

    RGB; the shorter side resized to `floor(size / crop_pct)` (bicubic, antialiased as
    PIL); the center `size x size` crop; divided by 255 (no mean/std). For the 256x256
    checkpoints: shorter side 288, crop 256; for the `_384` ones: 384, no crop.

    Args:
        images: a path, PIL image, uint8 array / tf tensor `(H, W[, C])`, a batch
            `(N, H, W, C)`, or a list mixing them (sizes may differ).
        model: the network (a model built with `weights=<tag>` uses its checkpoint's
            transform; otherwise its input size, crop_pct 1.0 at 384 and 0.888
            otherwise), an int size, or None (256).
        crop_pct: override of the center-crop fraction.

    Returns:
        float32 `(N, size, size, 3)` in [0, 1].

    Example:
        ```python
        model = keras_mvit2.MobileViTV2(0.75, weights="imagenet")
        x = keras_mvit2.preprocess_images(["cat.jpg", pil_image, uint8_array], model)
        keras_mvit2.decode_predictions(model.predict(x), top=5)
        ```
    """
    size, crop = eval_transform(model, crop_pct)
    layer = EvalResizeCrop(size, crop)
    items = _as_list(images)
    if not items:
        raise ValueError("preprocess_images got no images.")
    return np.stack([np.asarray(layer(load_image(item)[None]))[0] for item in items])
