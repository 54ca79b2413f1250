"""The checkpoints' evaluation transform as a KerasHub `ImageConverter`."""

from __future__ import annotations

import math

import keras_hub
import numpy as np
from keras_hub.src.utils.tensor_utils import (
    convert_preprocessing_outputs,
    convert_to_numpy,
    in_tf_function,
)

from keras_mvit2.api_export import serializable
from keras_mvit2.layers.eval_resize_crop import EvalResizeCrop
from keras_mvit2.models.mobilevitv2.mobilevitv2_backbone import MobileViTV2Backbone
from keras_mvit2.preprocessing import DEFAULT_CROP_PCT


def _is_one_over_255(scale) -> bool:
    return isinstance(scale, int | float) and math.isclose(scale, 1.0 / 255.0, rel_tol=1e-12)


@serializable
class MobileViTV2ImageConverter(keras_hub.layers.ImageConverter):
    """Raw RGB images -> MobileViTv2 input, with the checkpoint's evaluation transform.

    Unlike the base `ImageConverter` (which resizes the whole image, or crops to the
    aspect ratio, to `image_size`), this resizes the shorter side to
    `floor(size / crop_pct)` and keeps the center `size x size` square
    (`keras_mvit2.layers.EvalResizeCrop`, as timm / ml-cvnets evaluate the
    checkpoints: 288 bicubic then 256 for the 256x256 ones), then multiplies by `scale`
    and adds `offset` (the checkpoints take RGB in [0, 1]: `scale=1/255`, no offset).

    One form on every backend and every path: the transform is `EvalResizeCrop`'s
    TensorFlow form (`EvalResizeCrop.in_tf_data`: `tf.image.resize`), whether the
    converter runs inside a tf.data pipeline (keras-hub's `predict` / `fit` on a
    dataset), in a grain pipeline or called on arrays (keras-hub's `predict` on arrays
    with grain installed), so `predict(images)` and `predict(dataset)` agree bit for bit
    on JAX and PyTorch too (on their own kernels the resize would differ by up to 5e-5).
    keras-hub loads TensorFlow on every backend anyway (its `tensor_utils`). The output
    is a backend tensor (numpy inside grain, `tf.Tensor`s inside tf.data); with the
    checkpoints' `scale` it is exactly `keras_mvit2.preprocess_images` on TensorFlow,
    and within 5e-5 of it on JAX and PyTorch (which resize with the backend's kernel).

    Input: uint8 or float images in [0, 255], `(height, width, 3)` or a batch
    `(batch, height, width, 3)` of one size (any size).

    Args:
        image_size: `(size, size)`: the square output side (the checkpoint's input size).
        crop_pct: float in (0, 1]. Fraction of the resized shorter side kept.
        scale: float or per-channel tuple multiplied after the resize (`1/255`).
        offset: float or per-channel tuple added after `scale` (`None`).
        interpolation: resize interpolation (`"bicubic"`, the checkpoints').
        antialias: bool. Area-aware filtering when downscaling (PIL's behaviour).
        crop_to_aspect_ratio, pad_to_aspect_ratio, bounding_box_format, data_format:
            as `keras_hub.layers.ImageConverter` (kept for its config; the resize
            above always keeps the aspect ratio and center-crops).

    Example:
        ```python
        converter = keras_mvit2.kerashub.MobileViTV2ImageConverter((256, 256))
        converter(np.zeros((480, 640, 3), "uint8")).shape  # (256, 256, 3)
        ```
    """

    backbone_cls = MobileViTV2Backbone

    def __init__(
        self,
        image_size: tuple[int, int] = (256, 256),
        crop_pct: float = DEFAULT_CROP_PCT,
        scale=1.0 / 255.0,
        offset=None,
        interpolation: str = "bicubic",
        antialias: bool = True,
        crop_to_aspect_ratio: bool = True,
        pad_to_aspect_ratio: bool = False,
        bounding_box_format: str = "yxyx",
        data_format: str | None = None,
        **kwargs,
    ):
        super().__init__(
            image_size=image_size, scale=scale, offset=offset,
            crop_to_aspect_ratio=crop_to_aspect_ratio,
            pad_to_aspect_ratio=pad_to_aspect_ratio, interpolation=interpolation,
            antialias=antialias, bounding_box_format=bounding_box_format,
            data_format=data_format, **kwargs,
        )
        if self.data_format != "channels_last":
            raise ValueError(
                "MobileViTV2ImageConverter works on channels-last images. "
                f"Received: data_format={data_format!r}"
            )
        self.crop_pct = float(crop_pct)
        self._check_size(self.image_size)
        EvalResizeCrop(int(self.image_size[0]), self.crop_pct)  # validates the arguments

    @staticmethod
    def _check_size(image_size) -> None:
        if image_size is None or image_size[0] != image_size[1]:
            raise ValueError(
                "MobileViTV2ImageConverter needs a square image_size (the center crop). "
                f"Received: image_size={image_size}"
            )

    @property
    def image_size(self):
        return super().image_size

    @image_size.setter
    def image_size(self, value):
        self._check_size(value)
        self.resizing.height, self.resizing.width = value[0], value[1]

    def _call_python(self, inputs):
        # One form on every backend and every path (see the class docstring): inside
        # tf.data the graph's `tf.Tensor`s, elsewhere numpy in and the caller's form out.
        x = inputs if in_tf_function() else convert_to_numpy(inputs)
        layer = EvalResizeCrop(
            int(self.image_size[0]), self.crop_pct, interpolation=self.interpolation,
            antialias=self.antialias,
            # Divided by 255 in the layer, as `preprocess_images`: the same float32 bits.
            scale=self.offset is None and _is_one_over_255(self.scale))
        x = layer.in_tf_data(x[None])[0] if len(x.shape) == 3 else layer.in_tf_data(x)
        if self.scale is not None and not layer.scale:
            x = x * np.asarray(self.scale, "float32")  # per channel: the last axis
        if self.offset is not None:
            x = x + np.asarray(self.offset, "float32")
        # A backend tensor, numpy inside a grain pipeline, the tf.Tensor itself in tf.data.
        return convert_preprocessing_outputs(x)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(crop_pct=self.crop_pct)
        return config
