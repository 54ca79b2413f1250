"""Parameter and multiply-accumulate (MAC) counts of a Keras model.

MACs are counted on the model's traced TensorFlow graph at batch 1, from the
static shapes of its convolution and matrix-product ops (Conv2D, depthwise
convolution, MatMul, BatchMatMul, Einsum). Element-wise ops, norms and
softmax are not counted, the convention of the paper's tables and of
`torch.utils.flop_counter` halved.

Two counts are reported. `executed_macs` is what the traced graph runs.
`macs` is the architecture's count as the reference defines it, comparable
with published tables: keras_mvit2's separable attention applies its key
projection to the score-weighted tokens (the same function, fewer MACs), so
the MACs the reference spends projecting every token are added back.
"""

import math
import re
from dataclasses import asdict, dataclass

import keras
import numpy as np

from keras_mvit2.backend import require_tensorflow

require_tensorflow("keras_mvit2.profile (MAC counts from the TensorFlow graph)")

import tensorflow as tf  # noqa: E402

_BN_STATISTICS = ("moving_mean", "moving_variance")


@dataclass(frozen=True)
class ModelProfile:
    """Size and cost of a model at one input resolution."""

    name: str
    input_shape: tuple[int, ...]
    params: int
    trainable_params: int
    non_trainable_params: int
    macs: int
    executed_macs: int

    @property
    def gmacs(self) -> float:
        return self.macs / 1e9

    def to_dict(self) -> dict:
        return {**asdict(self), "gmacs": self.gmacs}


def _all_layers(layer):
    for sub in getattr(layer, "_flatten_layers", lambda **_: [])(include_self=False,
                                                                  recursive=False):
        yield sub
        yield from _all_layers(sub)


def reference_mac_adjustment(model: keras.Model) -> int:
    """MACs the reference spends that keras_mvit2's separable attention does not."""
    from keras_mvit2.layers.separable_self_attention import SeparableSelfAttention

    total = 0
    for layer in _all_layers(model):
        if isinstance(layer, SeparableSelfAttention) and layer.built:
            total += layer.key_projection_macs_saved() or 0
    return total


def _static(shape) -> list[int]:
    dims = shape.as_list()
    if any(d is None for d in dims):
        raise ValueError(f"MAC counting needs static shapes; got {dims}.")
    return dims


def _einsum_macs(op) -> int:
    equation = op.get_attr("equation").decode()
    lhs = equation.split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for labels, tensor in zip(lhs, op.inputs, strict=True):
        dims = _static(tensor.shape)
        for label, dim in zip(re.sub(r"\.\.\.", "", labels), dims[-len(labels):], strict=False):
            sizes[label] = dim
    return math.prod(sizes.values())


def _op_macs(op) -> int:
    kind = op.type
    if kind == "Conv2D":
        kh, kw, cin, _ = _static(op.inputs[1].shape)
        return math.prod(_static(op.outputs[0].shape)) * kh * kw * cin
    if kind == "DepthwiseConv2dNative":
        kh, kw, _, _ = _static(op.inputs[1].shape)
        return math.prod(_static(op.outputs[0].shape)) * kh * kw
    if kind == "MatMul":
        a = _static(op.inputs[0].shape)
        k = a[0] if op.get_attr("transpose_a") else a[1]
        return math.prod(_static(op.outputs[0].shape)) * k
    if kind in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        a = _static(op.inputs[0].shape)
        k = a[-2] if op.get_attr("adj_x") else a[-1]
        return math.prod(_static(op.outputs[0].shape)) * k
    if kind == "Einsum":
        return _einsum_macs(op)
    return 0


def count_macs(model: keras.Model, input_shape: tuple[int, ...] | None = None) -> int:
    """Multiply-accumulates of one forward pass at batch 1.

    `input_shape` (without batch) defaults to the model's own input shape.
    """
    shape = tuple(model.input_shape[1:]) if input_shape is None else tuple(input_shape)
    if any(d is None for d in shape):
        raise ValueError(
            f"count_macs needs a static input shape; pass input_shape=. Received: {shape}"
        )
    spec = tf.TensorSpec((1, *shape), tf.float32)
    graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec).graph
    return sum(_dilation_corrected(op, _op_macs(op)) for op in graph.get_operations())


def _dilation_corrected(op, macs: int) -> int:
    """MACs of a dilated convolution counted over the output it returns.

    TensorFlow runs a dilated convolution as SpaceToBatchND -> convolution (VALID) ->
    BatchToSpaceND; the space-to-batch pads the map to a multiple of the rate, so the
    inner convolution computes more outputs than the layer returns. Counted over the
    cropped BatchToSpaceND output instead:
    the paper's convention, and what TFLite runs (one dilated CONV_2D / DEPTHWISE_CONV_2D).
    """
    if not macs or op.type not in ("Conv2D", "DepthwiseConv2dNative"):
        return macs
    consumers = [c for c in op.outputs[0].consumers() if c.type == "BatchToSpaceND"]
    if len(consumers) != 1:
        return macs
    inner = math.prod(_static(op.outputs[0].shape))
    return macs * math.prod(_static(consumers[0].outputs[0].shape)) // inner


def count_params(model: keras.Model) -> tuple[int, int]:
    """`(trainable, non_trainable)` parameters; BN moving statistics are not parameters.

    Keras' `count_params()` also counts BatchNormalization moving means and
    variances; the reference (PyTorch) tables do not, so they are left out here.
    """
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    frozen = sum(
        int(np.prod(w.shape))
        for w in model.non_trainable_weights
        if not w.path.endswith(_BN_STATISTICS)
    )
    return trainable, frozen


def profile(model: keras.Model, input_shape: tuple[int, ...] | None = None) -> ModelProfile:
    """Parameters and MACs of `model` at batch 1 (see the module docstring for the two
    MAC counts). `input_shape` must be the shape the model was built for."""
    trainable, frozen = count_params(model)
    shape = tuple(model.input_shape[1:]) if input_shape is None else tuple(input_shape)
    executed = count_macs(model, shape)
    return ModelProfile(
        name=model.name,
        input_shape=shape,
        params=trainable + frozen,
        trainable_params=trainable,
        non_trainable_params=frozen,
        macs=executed + reference_mac_adjustment(model),
        executed_macs=executed,
    )
