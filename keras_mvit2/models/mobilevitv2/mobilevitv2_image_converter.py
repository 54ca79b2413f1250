"""The checkpoints' evaluation transform as a KerasHub `ImageConverter`."""

from __future__ import annotations

import math

import keras
import keras_hub
import numpy as np
from keras_hub.src.utils.tensor_utils import in_tf_function

from keras_mvit2.api_export import serializable
from keras_mvit2.backend import keras_backend_name
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
    The output is exactly `keras_mvit2.preprocess_images` for those checkpoints.

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

    def _resize_crop(self, x):
        # scale=False: [0, 255] out; `scale` / `offset` are applied below.
        layer = EvalResizeCrop(int(self.image_size[0]), self.crop_pct,
                               interpolation=self.interpolation, antialias=self.antialias,
                               scale=False, dtype=self.dtype_policy)
        # keras-hub's `predict` preprocesses in tf.data on every backend: there, off
        # TensorFlow, the layer's TensorFlow form (a layer call would need the backend's
        # tensors).
        transform = layer.in_tf_data if self._in_tf_data() else layer
        if len(x.shape) == 3:
            return transform(x[None])[0]
        return transform(x)

    @staticmethod
    def _in_tf_data() -> bool:
        return keras_backend_name() != "tensorflow" and in_tf_function()

    def _call_python(self, inputs):
        if isinstance(inputs, list | tuple):
            inputs = np.asarray(inputs)
        tf_data = self._in_tf_data()
        x = inputs if tf_data else keras.ops.convert_to_tensor(inputs)
        x = self._resize_crop(x)
        cast = (lambda v, t: v.astype(t.dtype.name)) if tf_data else (
            lambda v, t: keras.ops.cast(v, t.dtype))
        if self.scale is not None and self.offset is None and _is_one_over_255(self.scale):
            x = x / 255.0  # as EvalResizeCrop / preprocess_images: the same float32 bits
        elif self.scale is not None:
            x = x * cast(self._expand_non_channel_dims(self.scale, x), x)
        if self.offset is not None:
            x = x + cast(self._expand_non_channel_dims(self.offset, x), x)
        return x

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(crop_pct=self.crop_pct)
        return config
