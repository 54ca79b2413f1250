"""A float-exact rewrite for int8: the separable attention's output channels equalized.

In a trained MobileViTV2 the attention's output ``ReLU(v) * context`` (the input of
``out_proj``) is the activation with the widest spread between channels: at 256x256 the
largest channel's range is 5-17x the median channel's, so one per-tensor int8 step is
coarse for most channels (``docs/int8.md``). The product is linear in each factor and
``ReLU`` is positively homogeneous, so per channel ``c`` and factors ``a_c, b_c > 0``:

```
ReLU(a_c v_c) * (b_c k_c) = a_c b_c ReLU(v_c) k_c
out_proj(y)               = W_o y + b_o = (W_o / (a b)) (a b y) + b_o
```

`equalize_attention` scales the value columns of ``qkv_proj`` by ``a`` (equal value
ranges), the key columns by ``b`` (with ``a``, equal product ranges) and divides the
input channels of ``out_proj`` by ``a * b``: the same function, with the channel ranges
measured on calibration images made equal. The query column is untouched (the scores do
not change). Only `SeparableSelfAttention` layers are rewritten.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import numpy as np
from keras import ops

from keras_mvit2.layers import functional
from keras_mvit2.layers.separable_self_attention import SeparableSelfAttention

__all__ = ["AttentionEqualization", "equalize_attention"]


@dataclasses.dataclass(frozen=True)
class AttentionEqualization:
    """One attention layer's channel ranges before the rewrite.

    Attributes:
        layer: the attention layer's path (``"stage3_block1/transformer_0/attn"``).
        value_spread: largest / median channel range of ``ReLU(v)``.
        product_spread: largest / median channel range of ``ReLU(v) * context``.
    """

    layer: str
    value_spread: float
    product_spread: float


def equalize_attention(model: keras.Model, images: Any, *, batch_size: int = 16,
                       ) -> tuple[keras.Model, list[AttentionEqualization]]:
    """A copy of `model` with every separable attention's output channels equalized.

    Args:
        model: a built Keras model (not changed).
        images: calibration images, `(N, H, W, C)` float in the model's input range.
        batch_size: images per forward pass while measuring the ranges.

    Returns:
        The rewritten copy (the same function: logits equal to float32 rounding) and, per
        attention layer, the spreads that were equalized.
    """
    from keras_mvit2.export.tflite.layer_names import layer_paths

    images = np.asarray(images, dtype="float32")
    if images.ndim != 4 or not len(images):
        raise ValueError(
            "equalize_attention needs calibration images (N, H, W, C). "
            f"Received: shape={images.shape}"
        )
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    attention = {path: layer for path, layer in layer_paths(copy).items()
                 if isinstance(layer, SeparableSelfAttention)}
    ranges = _channel_ranges(copy, list(attention.values()), images, batch_size)
    report = []
    for path, layer in attention.items():
        value, product = ranges[id(layer)]
        report.append(AttentionEqualization(
            layer=path, value_spread=_spread(value), product_spread=_spread(product)))
        _rescale(layer, value, product)
    return copy, report


def _channel_ranges(model: keras.Model, layers: list, images: np.ndarray, batch_size: int):
    """Per layer: the largest |ReLU(v)| and |ReLU(v) * context| of each channel."""
    ranges = {id(layer): [0.0, 0.0] for layer in layers}

    def recording(layer):
        call = layer.call

        def record(inputs, training=None):
            value, product = _value_and_product(layer, inputs)
            kept = ranges[id(layer)]
            kept[0] = np.maximum(kept[0], value)
            kept[1] = np.maximum(kept[1], product)
            return call(inputs, training=training)

        return call, record

    originals = {}
    for layer in layers:
        originals[id(layer)], layer.call = recording(layer)
    try:
        for start in range(0, len(images), batch_size):
            model(images[start:start + batch_size], training=False)
    finally:
        for layer in layers:
            layer.call = originals[id(layer)]
    return {key: (np.maximum(v, 1e-12), np.maximum(p, 1e-12)) for key, (v, p) in ranges.items()}


def _value_and_product(layer: SeparableSelfAttention, inputs):
    """Per channel max |ReLU(v)| and max |ReLU(v) * context| of one call (the layer's math)."""
    x = inputs if len(inputs.shape) == 4 else ops.expand_dims(inputs, 2)
    d = layer.dim
    kernel = layer.qkv_proj.kernel
    bias = layer.qkv_proj.bias if layer.use_bias else None
    query = functional.pointwise_conv(x, kernel, bias, outputs=(0, 1))
    scores = functional.softmax_over_tokens(query, axis=1)
    pooled = functional.pool_tokens(x, scores, pooling="product_sum")
    context = functional.pointwise_conv(pooled, kernel, bias, outputs=(1, 1 + d))
    value = ops.relu(functional.pointwise_conv(x, kernel, bias, outputs=(1 + d, 1 + 2 * d)))

    def channel_max(t):
        return ops.convert_to_numpy(ops.max(ops.abs(ops.reshape(t, (-1, d))), axis=0))

    return channel_max(value), channel_max(value * context)


def _spread(ranges: np.ndarray) -> float:
    return float(np.max(ranges) / np.median(ranges))


def _geometric_mean(x: np.ndarray) -> float:
    return float(np.exp(np.mean(np.log(x))))


def _rescale(layer: SeparableSelfAttention, value: np.ndarray, product: np.ndarray) -> None:
    """Value columns x a, key columns x b, out_proj input channels / (a b)."""
    d = layer.dim
    # Factors limited to [1/16, 16]: a dead channel (range ~0) must not get a huge weight.
    a = np.clip(_geometric_mean(value) / value, 1 / 16, 16)          # equal ReLU(v) ranges
    b = np.clip(_geometric_mean(product) / product / a, 1 / 16, 16)  # with a: equal products
    kernel = np.array(layer.qkv_proj.kernel)
    kernel[..., 1:1 + d] *= b
    kernel[..., 1 + d:] *= a
    layer.qkv_proj.kernel.assign(kernel)
    if layer.use_bias:
        bias = np.array(layer.qkv_proj.bias)
        bias[1:1 + d] *= b
        bias[1 + d:] *= a
        layer.qkv_proj.bias.assign(bias)
    out_kernel = np.array(layer.out_proj.kernel)        # (1, 1, d, d): input channels axis 2
    layer.out_proj.kernel.assign(out_kernel / (a * b)[None, None, :, None])
