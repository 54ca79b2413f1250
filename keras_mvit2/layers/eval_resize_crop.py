"""The checkpoints' evaluation transform as a Keras layer: resize the shorter side,
center-crop a square, scale to [0, 1]."""

import math

import keras
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.backend import forms
from keras_mvit2.utils.arguments import validate_positive_ints


@serializable
class EvalResizeCrop(keras.layers.Layer):
    """Resizes the shorter side to `floor(size / crop_pct)`, keeps the center `size x size`
    square and divides by 255: timm's / ml-cvnets' evaluation transform of the
    MobileViTv2 checkpoints (256: shorter side 288 bicubic, crop 256; 384: crop_pct 1.0).

    As torchvision's `Resize(int)` + `CenterCrop`: the longer side becomes
    `floor(resize * long / short)`, the crop offset is `round((side - size) / 2)`
    (half to even). Resizing uses `tf.image.resize(..., antialias=True)` (what
    `keras.ops.image.resize` runs on the TF backend; it also traces in `tf.function`), whose
    bicubic is the Keys kernel with a = -0.5 like PIL's, so downscaling matches PIL's
    area-aware resize. On JAX and PyTorch it is `keras.ops.image.resize` with the backend's
    own antialiased kernels (close to TensorFlow's). Images of any size go in; batches must
    share one size.

    Input shape: `(batch, height, width, channels)`, RGB values in [0, 255] (any dtype).
    Output shape: `(batch, size, size, channels)`, float32 in [0, 1] (`scale=True`) or
    [0, 255].

    Args:
        size: int. Output side (the checkpoint's input size).
        crop_pct: float in (0, 1]. Fraction of the resized shorter side kept.
        interpolation: `"bicubic"` (the checkpoints'), `"bilinear"`, ... (any of
            `keras.ops.image.resize`).
        antialias: bool. Area-aware filtering when downscaling (PIL's behaviour).
        scale: bool. Divide by 255 (the checkpoints take RGB in [0, 1]).

    Example:
        ```python
        layer = keras_mvit2.layers.EvalResizeCrop(256, crop_pct=0.888)
        layer(np.zeros((1, 480, 640, 3), "uint8")).shape  # (1, 256, 256, 3)
        ```
    """

    def __init__(self, size: int, crop_pct: float = 0.888, interpolation: str = "bicubic",
                 antialias: bool = True, scale: bool = True, **kwargs):
        super().__init__(**kwargs)
        validate_positive_ints(size=size)
        if not 0.0 < float(crop_pct) <= 1.0:
            raise ValueError(f"crop_pct must be in (0, 1]. Received: crop_pct={crop_pct!r}")
        self.size = size
        self.crop_pct = float(crop_pct)
        self.interpolation = interpolation
        self.antialias = bool(antialias)
        self.scale = bool(scale)
        self.resize_size = math.floor(size / self.crop_pct)

    def call(self, images):
        return self._transform(images, ops, forms.resize_shorter_side)

    def in_tf_data(self, images):
        """The transform on `tf.Tensor`s inside a tf.data pipeline, whatever Keras' backend
        (keras-hub's preprocessors run there): the TensorFlow form, computed with Keras'
        TensorFlow backend ops (a layer call would convert the inputs to the backend's
        tensors, which a tf.data graph cannot). On TensorFlow: the layer's own graph."""
        xp, resize_shorter_side = forms.tf_data_forms()
        return self._transform(images, xp, resize_shorter_side)

    def _transform(self, images, xp, resize_shorter_side):
        x = xp.cast(images, "float32")
        shape = xp.shape(x)
        # torchvision: the shorter side -> resize_size, the longer -> int(resize * long / short)
        # (TensorFlow: sizes computed in the graph, `tf.image.resize`; JAX / PyTorch: ints,
        # `keras.ops.image.resize`).
        x, new_h, new_w = resize_shorter_side(
            x, shape, float(self.resize_size), self.interpolation, self.antialias)
        top = xp.cast(xp.round(xp.cast(new_h - self.size, "float32") / 2.0), "int32")
        left = xp.cast(xp.round(xp.cast(new_w - self.size, "float32") / 2.0), "int32")
        x = xp.slice(x, (0, top, left, 0), (shape[0], self.size, self.size, shape[3]))
        x = xp.clip(x, 0.0, 255.0)
        if self.scale:
            x = x / 255.0
        return xp.reshape(x, (-1, self.size, self.size, images.shape[-1] or shape[3]))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.size, self.size, input_shape[-1])

    def compute_output_spec(self, images):
        # float32 under any dtype policy, as the transform computes (Keras' default spec
        # would say the policy's compute dtype, float16 under "mixed_float16").
        return keras.KerasTensor(self.compute_output_shape(images.shape), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update(size=self.size, crop_pct=self.crop_pct, interpolation=self.interpolation,
                      antialias=self.antialias, scale=self.scale)
        return config

