"""TensorFlow implementations of the Core ML MIL operations our ML Programs use.

`keras_mvit2.export.coreml.package_weights` runs a saved `.mlpackage`'s own MIL program
with these, on any OS, so that a compressed package's accuracy can be measured with
exactly the weights Core ML will use. Each function takes the MIL operation and its
inputs (`tf.Tensor` for computed values, NumPy for constants) and returns the outputs,
following the MIL specification (coremltools' `mil/ops/defs`): tensors are laid out as
MIL lays them out (convolutions channels-first, `(B, C, H, W)`; transposed to TF's
channels-last around each convolution, as TF's CPU kernels need).

Compute is float32: a float16 cast is the identity (`CAST_TO_FP16_IS_IDENTITY`), so a
float16 program runs with its float16 weights (exactly representable in float32) and
float32 activations. `quantize` / `dequantize` (activation quantization) are simulated
in float32 (``round(x / scale) + zero_point``, clipped; then ``scale * (q - zero_point)``).
An operation without an implementation here is a `NotImplementedError` naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["MIL_OPS", "implemented_ops"]

Value = Any  # tf.Tensor or np.ndarray
OpFunction = Callable[..., Value]


def _float(v: Value) -> tf.Tensor:
    """`v` as a float32 tensor (float constants of any width are cast; values kept)."""
    if isinstance(v, tf.Tensor):
        return v if v.dtype == tf.float32 or not v.dtype.is_floating else tf.cast(v, tf.float32)
    v = np.asarray(v)
    return tf.constant(v.astype(np.float32) if np.issubdtype(v.dtype, np.floating) else v)


def _static(v: Value, name: str) -> Any:
    if isinstance(v, tf.Tensor):
        raise NotImplementedError(f"MIL input {name!r} computed at run time is not supported here")
    return None if v is None else np.asarray(v).tolist()


# ------------------------------------------------------------------------------------
# element-wise

_BINARY = {
    "add": tf.add, "sub": tf.subtract, "mul": tf.multiply, "real_div": tf.divide,
    "maximum": tf.maximum, "minimum": tf.minimum, "pow": tf.pow, "floor_div": tf.math.floordiv,
}
_UNARY = {
    "relu": tf.nn.relu, "relu6": tf.nn.relu6, "sigmoid": tf.sigmoid, "silu": tf.nn.silu,
    "tanh": tf.tanh, "exp": tf.exp, "sqrt": tf.sqrt, "abs": tf.abs, "square": tf.square,
    "erf": tf.math.erf, "sin": tf.sin, "cos": tf.cos, "floor": tf.floor, "ceil": tf.math.ceil,
    "round": tf.round, "sign": tf.sign, "identity": tf.identity,
}


def _binary(fn):
    return lambda op, x, y: fn(_float(x), _float(y))


def _unary(fn):
    return lambda op, x: fn(_float(x))


def _with_epsilon(fn, default: float):
    """A unary op computed as `fn(x + epsilon)` (MIL's default `epsilon`)."""
    return lambda op, x, epsilon=default: fn(_float(x) + float(epsilon))


def _clip(op, x, alpha, beta):
    return tf.clip_by_value(_float(x), float(alpha), float(beta))


def _leaky_relu(op, x, alpha=0.01):
    return tf.nn.leaky_relu(_float(x), float(alpha))


def _gelu(op, x, mode="EXACT"):
    approximate = {"EXACT": False, "TANH_APPROXIMATION": True}.get(str(mode))
    if approximate is None:
        x = _float(x)
        return x * tf.sigmoid(1.702 * x)  # SIGMOID_APPROXIMATION
    return tf.nn.gelu(_float(x), approximate=approximate)


def _cast(op, x, dtype):
    # float16 is computed in float32 (see the module doc)
    target = {"fp16": tf.float32, "fp32": tf.float32, "int32": tf.int32, "bool": tf.bool,
              "int16": tf.int32, "int8": tf.int32, "uint8": tf.int32}[str(dtype)]
    x = x if isinstance(x, tf.Tensor) else tf.constant(np.asarray(x))
    return tf.cast(x, target)


# ------------------------------------------------------------------------------------
# shapes


def _with_static(fn, name: str):
    """An op computed as `fn(x, <its constant input `name`>)`."""
    return lambda op, x, **inputs: fn(_float(x), _static(inputs.get(name), name))


def _expand_dims(op, x, axes):
    x, axes = _float(x), _static(axes, "axes")
    rank = x.shape.rank + len(axes)
    for axis in sorted(a % rank for a in axes):
        x = tf.expand_dims(x, axis)
    return x


def _concat(op, values, axis, interleave=False):
    if bool(interleave):
        raise NotImplementedError("MIL concat with interleave=True is not supported here")
    return tf.concat([_float(v) for v in values], int(axis))


def _split(op, x, axis, num_splits=None, split_sizes=None):
    sizes = _static(split_sizes, "split_sizes")
    return tuple(tf.split(_float(x), sizes if sizes is not None else int(num_splits), int(axis)))


def _slice_by_index(op, x, begin, end, stride=None, begin_mask=None, end_mask=None,
                    squeeze_mask=None):
    def mask(m):
        return sum(1 << i for i, b in enumerate(_static(m, "mask") or []) if b)

    begin, end = _static(begin, "begin"), _static(end, "end")
    return tf.strided_slice(_float(x), begin, end, _static(stride, "stride") or [1] * len(begin),
                            begin_mask=mask(begin_mask), end_mask=mask(end_mask),
                            shrink_axis_mask=mask(squeeze_mask))


def _slice_by_size(op, x, begin, size):
    return tf.slice(_float(x), _static(begin, "begin"), _static(size, "size"))


def _pad(op, x, pad, mode="constant", constant_val=0.0):
    x = _float(x)
    pad = np.asarray(_static(pad, "pad")).reshape(-1, 2)
    paddings = [[0, 0]] * (x.shape.rank - len(pad)) + pad.tolist()
    mode = {"constant": "CONSTANT", "reflect": "REFLECT", "replicate": "SYMMETRIC"}[str(mode)]
    if mode == "SYMMETRIC" and any(max(p) > 1 for p in paddings):
        raise NotImplementedError("MIL pad mode 'replicate' wider than 1 is not supported here")
    return tf.pad(x, paddings, mode=mode, constant_values=float(constant_val))


def _nchw(fn):
    """`fn` applied to the channels-last view of a `(B, C, H, W)` tensor."""
    def apply(x):
        return tf.transpose(fn(tf.transpose(_float(x), (0, 2, 3, 1))), (0, 3, 1, 2))
    return apply


def _rearrange(fn):
    """`depth_to_space` / `space_to_depth` of a `(B, C, H, W)` tensor, as TF's `fn`."""
    return lambda op, x, block_size: _nchw(lambda t: fn(t, int(block_size)))(x)


_SAMPLING = {"DEFAULT": (False, False), "ALIGN_CORNERS": (True, False),
             "STRICT_ALIGN_CORNERS": (True, False), "UNALIGN_CORNERS": (False, True)}


def _bilinear(x, size, mode: str):
    if mode not in _SAMPLING:
        raise NotImplementedError(f"MIL bilinear resize with sampling_mode {mode!r} is not "
                                  "supported here")
    align, half_pixel = _SAMPLING[mode]
    return _nchw(lambda t: tf.raw_ops.ResizeBilinear(
        images=t, size=size, align_corners=align, half_pixel_centers=half_pixel))(x)


def _resize_bilinear(op, x, target_size_height=1, target_size_width=1,
                     sampling_mode="DEFAULT"):
    size = [int(target_size_height), int(target_size_width)]
    return _bilinear(x, size, str(sampling_mode))


def _upsample_bilinear(op, x, scale_factor_height=1, scale_factor_width=1, align_corners=True,
                       half_pixel_centers=None):
    if half_pixel_centers is not None and bool(half_pixel_centers):
        mode = "UNALIGN_CORNERS"
    else:
        mode = "ALIGN_CORNERS" if bool(align_corners) else "DEFAULT"
    height, width = x.shape[2], x.shape[3]
    size = [int(height * float(scale_factor_height)), int(width * float(scale_factor_width))]
    return _bilinear(x, size, mode)


def _upsample_nearest_neighbor(op, x, scale_factor_height=1, scale_factor_width=1):
    h, w = int(scale_factor_height), int(scale_factor_width)
    if (h, w) != (float(scale_factor_height), float(scale_factor_width)):
        raise NotImplementedError("MIL upsample_nearest_neighbor with fractional scales is "
                                  "not supported here")
    return tf.repeat(tf.repeat(_float(x), h, axis=2), w, axis=3)


# ------------------------------------------------------------------------------------
# reductions, normalisation


def _reduce(fn):
    def reduce(op, x, axes=None, keep_dims=False):
        return fn(_float(x), _static(axes, "axes"), keepdims=bool(keep_dims))
    return reduce


def _softmax(op, x, axis=-1):
    return tf.nn.softmax(_float(x), axis=int(axis))


def _layer_norm(op, x, axes=None, gamma=None, beta=None, epsilon=1e-5):
    x = _float(x)
    axes = _static(axes, "axes")
    mean, var = tf.nn.moments(x, axes, keepdims=True)
    y = (x - mean) * tf.math.rsqrt(var + float(epsilon))
    y = y if gamma is None else y * _float(gamma)
    return y if beta is None else y + _float(beta)


def _batch_norm(op, x, mean, variance, gamma=None, beta=None, epsilon=1e-5):
    x = _float(x)
    shape = [1, -1] + [1] * (x.shape.rank - 2)
    scale = tf.math.rsqrt(tf.reshape(_float(variance), shape) + float(epsilon))
    if gamma is not None:
        scale = scale * tf.reshape(_float(gamma), shape)
    y = (x - tf.reshape(_float(mean), shape)) * scale
    return y if beta is None else y + tf.reshape(_float(beta), shape)


# ------------------------------------------------------------------------------------
# linear algebra, convolutions, pooling


def _matmul(op, x, y, transpose_x=False, transpose_y=False):
    return tf.linalg.matmul(_float(x), _float(y), transpose_a=bool(transpose_x),
                            transpose_b=bool(transpose_y))


def _linear(op, x, weight, bias=None):
    y = tf.linalg.matmul(_float(x), _float(weight), transpose_b=True)
    return y if bias is None else y + _float(bias)


def _explicit_pads(op, spatial: tuple[int, ...], kernel: tuple[int, ...], strides, dilations,
                   pad_type: str, pad) -> list[list[int]]:
    """`[[before, after], ...]` per spatial axis for MIL's `pad_type` (valid, same,
    same_lower, custom)."""
    if pad_type == "custom":
        return np.asarray(_static(pad, "pad")).reshape(-1, 2).tolist()
    if pad_type == "valid":
        return [[0, 0] for _ in spatial]
    pads = []
    for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        pads.append([small, total - small] if pad_type == "same" else [total - small, small])
    return pads


def _conv(op, x, weight, bias=None, strides=None, pad_type="valid", pad=None, dilations=None,
          groups=1):
    x, w = _float(x), np.asarray(weight, np.float32) if not isinstance(weight, tf.Tensor) else None
    if w is None or x.shape.rank != 4:
        raise NotImplementedError("MIL conv is supported here for 2-D convolutions with "
                                  "constant weights")
    cout, cin_group, kh, kw = w.shape
    strides = _static(strides, "strides") or [1, 1]
    dilations = _static(dilations, "dilations") or [1, 1]
    pads = _explicit_pads(op, tuple(x.shape[2:]), (kh, kw), strides, dilations, str(pad_type), pad)
    t = tf.pad(tf.transpose(x, (0, 2, 3, 1)), [[0, 0], *pads, [0, 0]])   # (B, H, W, C)
    groups, cin = int(groups), int(x.shape[1])
    if groups == 1:
        y = tf.nn.conv2d(t, w.transpose(2, 3, 1, 0), [1, *strides, 1], "VALID",
                         dilations=[1, *dilations, 1])
    elif groups == cin and cin_group == 1 and strides[0] == strides[1]:
        # depthwise: output channel g * M + m reads input channel g
        kernel = w.reshape(cin, cout // cin, kh, kw).transpose(2, 3, 0, 1)
        y = tf.nn.depthwise_conv2d(t, kernel, [1, *strides, 1], "VALID",
                                   dilations=dilations if max(dilations) > 1 else None)
    else:
        per = cout // groups
        parts = tf.split(t, groups, axis=-1)
        y = tf.concat([
            tf.nn.conv2d(part, w[g * per:(g + 1) * per].transpose(2, 3, 1, 0),
                         [1, *strides, 1], "VALID", dilations=[1, *dilations, 1])
            for g, part in enumerate(parts)], axis=-1)
    if bias is not None:
        y = y + _float(bias)
    return tf.transpose(y, (0, 3, 1, 2))


def _pool(kind: str):
    def pool(op, x, kernel_sizes, strides, pad_type, pad=None, exclude_padding_from_average=False,
             ceil_mode=False):
        x = _float(x)
        if bool(ceil_mode) or x.shape.rank != 4:
            raise NotImplementedError(f"MIL {kind}_pool with ceil_mode or rank != 4 is not "
                                      "supported here")
        kernel, strides = _static(kernel_sizes, "kernel_sizes"), _static(strides, "strides")
        pads = _explicit_pads(op, tuple(x.shape[2:]), tuple(kernel), strides, [1, 1],
                              str(pad_type), pad)
        if any(max(p) for p in pads) and not (kind == "avg" and not exclude_padding_from_average):
            raise NotImplementedError(f"padded MIL {kind}_pool is not supported here")
        t = tf.pad(tf.transpose(x, (0, 2, 3, 1)), [[0, 0], *pads, [0, 0]])
        fn = tf.nn.avg_pool2d if kind == "avg" else tf.nn.max_pool2d
        return tf.transpose(fn(t, kernel, strides, "VALID"), (0, 3, 1, 2))
    return pool


# ------------------------------------------------------------------------------------
# activation quantization (W8A8), classifier head

_INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}


def _quantize(op, input, scale, output_dtype, zero_point=None, axis=None):
    low, high = _INT_RANGE[str(output_dtype)]
    zero = 0.0 if zero_point is None else _float(np.asarray(zero_point, np.float32))
    return tf.clip_by_value(tf.round(_float(input) / _float(scale)) + zero, low, high)


def _dequantize(op, input, scale, zero_point=None, axis=None):
    zero = 0.0 if zero_point is None else _float(np.asarray(zero_point, np.float32))
    return (_float(input) - zero) * _float(scale)


def _classify(op, probabilities, classes):
    # The class label is the argmax; the scores are what the caller reads.
    return _float(probabilities), _float(probabilities)


MIL_OPS: dict[str, OpFunction] = {
    **{name: _binary(fn) for name, fn in _BINARY.items()},
    **{name: _unary(fn) for name, fn in _UNARY.items()},
    "rsqrt": _with_epsilon(tf.math.rsqrt, 1e-12),
    "inverse": _with_epsilon(lambda t: 1.0 / t, 1e-4),
    "log": _with_epsilon(tf.math.log, 1e-45),
    "clip": _clip, "gelu": _gelu, "leaky_relu": _leaky_relu, "cast": _cast,
    "reshape": _with_static(tf.reshape, "shape"), "transpose": _with_static(tf.transpose, "perm"),
    "squeeze": _with_static(tf.squeeze, "axes"), "tile": _with_static(tf.tile, "reps"),
    "expand_dims": _expand_dims, "concat": _concat, "split": _split,
    "slice_by_index": _slice_by_index, "slice_by_size": _slice_by_size,
    "resize_bilinear": _resize_bilinear, "upsample_bilinear": _upsample_bilinear,
    "upsample_nearest_neighbor": _upsample_nearest_neighbor,
    "pad": _pad, "depth_to_space": _rearrange(tf.nn.depth_to_space),
    "space_to_depth": _rearrange(tf.nn.space_to_depth),
    "reduce_mean": _reduce(tf.reduce_mean), "reduce_sum": _reduce(tf.reduce_sum),
    "reduce_max": _reduce(tf.reduce_max), "reduce_min": _reduce(tf.reduce_min),
    "softmax": _softmax, "layer_norm": _layer_norm, "batch_norm": _batch_norm,
    "matmul": _matmul, "linear": _linear, "conv": _conv,
    "avg_pool": _pool("avg"), "max_pool": _pool("max"),
    "quantize": _quantize, "dequantize": _dequantize, "classify": _classify,
}


def implemented_ops() -> tuple[str, ...]:
    """The MIL operation types `MIL_OPS` runs (besides `const` and the `constexpr_*`
    weight decompressions, which `package_weights` evaluates)."""
    return tuple(sorted(MIL_OPS))
