"""The calibrated float graph of a full-int8 conversion, run as a trainable TensorFlow function
that rounds every tensor as the int8 file rounds it.

Quantization-aware training on the shipped graph (`keras_mvit2.quantize.qat`) trains the
weights of the very graph the converter quantizes: the calibrated float flatbuffer that
`to_tflite(quantization="int8")` hands to the MLIR quantizer (1x1 pairs fused, the
GroupNorm's ``E[x^2]`` as a matrix product, the token sum: the `export_forms.INT8` forms).
`QuantizedGraph(calibrated, quantized)` reads both that graph and the post-training file made
from it; tensors are matched by name (the quantizer keeps them). In the training call:

* every activation tensor the int8 file holds as int8 is rounded to that file's grid (its
  scale and zero point: the post-training ranges, held), with the straight-through gradient
  of ``tf.quantization.fake_quant_with_min_max_args``;
* a weight the converter quantizes per channel is rounded per channel with the step the
  converter will compute from the current weights (``max |w| / 127``), its int32 bias with
  ``input step x weight step``; constants that are not trained keep the file's own values.

Trained are the kernels and biases of CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED. The
graph has the file's batch of 1; a RESHAPE keeps its output's shape with the leading
dimension free, so it runs on batches (checked when the graph is built).
`calibrated_with()` writes the trained weights back into the calibrated flatbuffer, for the
same quantizer call: at learning rate 0 the result has the post-training file's ops,
tensors, quantization parameters and outputs (its metadata also records the schedule).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from keras_mvit2.export.tflite.flatbuffer import (
    constant_array,
    decode_name,
    op_names,
    parse_flatbuffer,
    read_flatbuffer,
    serialize_flatbuffer,
    tensor_indices,
)

__all__ = ["QuantizedGraph", "UnsupportedGraphError"]

_TRAINED_OPS = {"CONV_2D": (1, 2), "DEPTHWISE_CONV_2D": (1, 2), "FULLY_CONNECTED": (1, 2)}
_INT8, _INT32 = 9, 2  # tfl TensorType codes
_PADDING = {0: "SAME", 1: "VALID"}


class UnsupportedGraphError(ValueError):
    """The calibrated graph holds an op the trainable graph does not implement."""


def _activation(x: tf.Tensor, code: int) -> tf.Tensor:
    if code == 0:
        return x
    if code == 1:
        return tf.nn.relu(x)
    if code == 2:
        return tf.clip_by_value(x, -1.0, 1.0)
    if code == 3:
        return tf.nn.relu6(x)
    if code == 4:
        return tf.tanh(x)
    raise UnsupportedGraphError(f"fused activation {code} is not supported")


class QuantizedGraph:
    """The calibrated float graph with the post-training file's rounding, trainable.

    Args:
        calibrated: the calibrated float flatbuffer (activation min / max annotated, after the
            range selection) that the quantizer turned into `quantized`.
        quantized: the post-training full-int8 flatbuffer made from it.

    Attributes:
        variables: the trainable weights, by tensor index of the calibrated graph.
        quantized_tensors: indices of the tensors rounded in the training call.
    """

    def __init__(self, calibrated: bytes, quantized: bytes):
        self._calibrated = bytes(calibrated)
        self._model = parse_flatbuffer(self._calibrated)
        if len(self._model.subgraphs) != 1:
            raise UnsupportedGraphError("only single-subgraph models are supported")
        graph = self._model.subgraphs[0]
        self._tensors = graph.tensors
        kinds = op_names(self._model)
        self._ops = [(kinds[op.opcodeIndex], op) for op in graph.operators or []]
        self._inputs = tensor_indices(graph.inputs)
        self._outputs = tensor_indices(graph.outputs)
        if len(self._inputs) != 1:
            raise UnsupportedGraphError("only one-input models are supported")
        unsupported = sorted({kind for kind, _ in self._ops} - set(_OPS))
        if unsupported:
            raise UnsupportedGraphError(
                f"quantization-aware training on the shipped graph does not implement the "
                f"ops {unsupported}; use the post-training int8 file (to_tflite).")
        file = read_flatbuffer(bytes(quantized))
        by_name = {decode_name(t.name): t for t in file.subgraphs[0].tensors}
        self._constants: dict[int, np.ndarray] = {}
        for i, tensor in enumerate(self._tensors):
            value = constant_array(self._model, tensor)
            if value is not None:
                self._constants[i] = value
        # Which constants are trained, and the op each belongs to.
        self.variables: dict[int, tf.Variable] = {}
        self._bias_of: dict[int, tuple[int, int]] = {}  # bias -> (input, kernel)
        for kind, op in self._ops:
            if kind not in _TRAINED_OPS:
                continue
            ins = tensor_indices(op.inputs)
            kernel = ins[1]
            bias = ins[2] if len(ins) > 2 and ins[2] >= 0 else None
            for i in (kernel, bias):
                if i is not None and i in self._constants and self._float(i):
                    self.variables[i] = tf.Variable(self._constants[i], name=f"t{i}")
            if bias is not None and bias in self.variables:
                self._bias_of[bias] = (ins[0], kernel)
        # The rounding of each tensor, from the post-training file.
        self._step: dict[int, tuple[np.ndarray, np.ndarray, int, int]] = {}
        self._range: dict[int, tuple[float, float]] = {}
        for i, tensor in enumerate(self._tensors):
            if not self._float(i):
                continue
            spec = by_name.get(decode_name(tensor.name))
            q = None if spec is None else spec.quantization
            if (q is not None and q.scale is not None and len(q.scale)
                    and int(spec.type) in (_INT8, _INT32)):
                scale = np.asarray(q.scale, np.float32)
                zero = np.asarray(q.zeroPoint, np.int64)
                self._step[i] = (scale, zero, int(q.quantizedDimension), int(spec.type))
                if i in self._constants or len(scale) != 1 or int(spec.type) != _INT8:
                    continue
                low = float((-128 - zero[0]) * scale[0])
                high = float((127 - zero[0]) * scale[0])
            elif i not in self._constants and tensor.quantization is not None and (
                    tensor.quantization.min is not None and len(tensor.quantization.min) == 1):
                # The graph's input and output: float in the file, beside a QUANTIZE /
                # DEQUANTIZE; their int8 twin has the calibrated range.
                low = min(float(tensor.quantization.min[0]), 0.0)
                high = max(float(tensor.quantization.max[0]), 0.0)
            else:
                continue
            self._range[i] = (low, high)
        self.quantized_tensors = sorted(set(self._step) | set(self._range))
        self._check_batches()

    # ------------------------------------------------------------------ reading

    def _float(self, i: int) -> bool:
        return int(self._tensors[i].type) == 0  # FLOAT32

    def _check_batches(self) -> None:
        """The graph on a batch of 2 gives each image's batch-1 output, or a clear error."""
        shape = tensor_indices(self._tensors[self._inputs[0]].shape)
        images = tf.random.stateless_uniform([2, *shape[1:]], seed=[1, 2])
        try:
            both = self(images, quantize=False)
            ok = all(np.allclose(both[k].numpy(), self(images[k:k + 1], quantize=False)[0],
                                 atol=1e-4, rtol=1e-4) for k in (0, 1))
        except (tf.errors.InvalidArgumentError, ValueError):
            ok = False
        if not ok:
            raise UnsupportedGraphError(
                "quantization-aware training cannot run this int8 graph on batches (a "
                "reshape folds the batch into another dimension); use the post-training int8 "
                "file (to_tflite).")

    def logits_tensor(self) -> tuple[int, float]:
        """The tensor whose values are the model's logits, and the softmax ``beta`` that
        maps them to its output (``1.0`` when the output is the logits)."""
        out = self._outputs[0]
        for kind, op in self._ops:
            if kind == "SOFTMAX" and out in tensor_indices(op.outputs):
                return tensor_indices(op.inputs)[0], float(op.builtinOptions.beta)
        return out, 1.0

    # ------------------------------------------------------------------ running

    def __call__(self, images: tf.Tensor, *, quantize: bool = True, trained: bool = True,
                 output: int | None = None) -> tf.Tensor:
        """The graph's first output (or tensor `output`) on `images` `(B, H, W, C)`,
        rounded as the int8 file rounds (`quantize`) or in float, with the current weights
        (`trained`) or the calibrated graph's own (the float model: the teacher)."""
        values: dict[int, tf.Tensor] = {}

        def get(i: int) -> tf.Tensor:
            if i in values:
                return values[i]
            if trained and i in self.variables:
                value = self.variables[i]
                if quantize:
                    value = self._round_weight(i, value, values)
            else:
                value = tf.constant(self._constants[i])
                if quantize and i in self._step and self._float(i) and (
                        i not in self.variables):
                    value = self._round_fixed(i, value)
            values[i] = value
            return value

        values[self._inputs[0]] = self._round_activation(self._inputs[0], images, quantize)
        for kind, op in self._ops:
            ins = [get(i) if i >= 0 else None for i in tensor_indices(op.inputs)]
            result = _OPS[kind](op, ins, self._tensors, self._constants,
                                tensor_indices(op.inputs))
            outs = tensor_indices(op.outputs)
            for j, value in zip(outs, result if len(outs) > 1 else [result], strict=True):
                values[j] = self._round_activation(j, value, quantize)
            if output is not None and output in outs:
                return values[output]
        return values[self._outputs[0] if output is None else output]

    def _round_activation(self, i: int, x: tf.Tensor, quantize: bool) -> tf.Tensor:
        if not quantize or i not in self._range:
            return x
        low, high = self._range[i]
        return tf.quantization.fake_quant_with_min_max_args(x, low, high, num_bits=8)

    def _round_fixed(self, i: int, value: tf.Tensor) -> tf.Tensor:
        """A constant that is not trained, rounded with the file's own step."""
        scale, zero, axis, kind = self._step[i]
        shape = [1] * len(value.shape)
        if len(scale) > 1:
            shape[axis] = len(scale)
        s = tf.reshape(tf.constant(scale), shape)
        z = tf.reshape(tf.constant(zero.astype(np.float32)), shape)
        low, high = (-128.0, 127.0) if kind == _INT8 else (-2.0**31, 2.0**31)
        return (tf.clip_by_value(tf.round(value / s) + z, low, high) - z) * s

    def _weight_steps(self, kernel: int, value: tf.Tensor) -> tf.Tensor:
        """The converter's symmetric step of `kernel`'s current values (per channel where
        the file quantizes per channel), shaped to broadcast against the kernel."""
        scale, _, axis, _ = self._step[kernel]
        if len(scale) > 1:
            axes = [a for a in range(len(value.shape)) if a != axis]
            peak = tf.reduce_max(tf.abs(value), axis=axes, keepdims=True)
        else:
            peak = tf.reduce_max(tf.abs(value))
        return tf.stop_gradient(tf.maximum(peak, 1e-12) / 127.0)

    def _round_weight(self, i: int, value: tf.Tensor, values: Mapping[int, tf.Tensor]):
        if i not in self._step:
            return value
        if i in self._bias_of:
            source, kernel = self._bias_of[i]
            if source not in self._range:  # a float input: the bias stays float too
                return value
            steps = tf.reshape(self._weight_steps(kernel, self.variables[kernel]), [-1])
            step = tf.stop_gradient(self._input_step(source) * steps)
            rounded = tf.round(value / step) * step
        else:
            step = self._weight_steps(i, value)
            rounded = tf.clip_by_value(tf.round(value / step), -127.0, 127.0) * step
        return value + tf.stop_gradient(rounded - value)

    def _input_step(self, i: int) -> float:
        low, high = self._range[i]
        return (high - low) / 255.0

    # ------------------------------------------------------------------ writing

    def calibrated_with(self) -> bytes:
        """The calibrated flatbuffer with the current weights: what the quantizer turns into
        the trained file. Unchanged weights give the same bytes."""
        model = parse_flatbuffer(self._calibrated)
        tensors = model.subgraphs[0].tensors
        changed = False
        for i, variable in self.variables.items():
            value = variable.numpy().astype(np.float32)
            if np.array_equal(value, self._constants[i]):
                continue
            buffer = model.buffers[tensors[i].buffer]
            buffer.data = np.frombuffer(value.tobytes(), np.uint8)
            changed = True
        if not changed:
            return self._calibrated
        return serialize_flatbuffer(model, size_hint=len(self._calibrated) + 1024)


# ---------------------------------------------------------------------- the ops

#: ``f(op, inputs, tensors, constants, input indices)``: an op's output (a list for several).
Op = Callable[[Any, list, list, dict, list], Any]


def _conv(op, ins, tensors, constants, idx):
    o = op.builtinOptions
    kernel = tf.transpose(ins[1], [1, 2, 3, 0])  # OHWI -> HWIO
    y = tf.nn.conv2d(ins[0], kernel, [1, o.strideH, o.strideW, 1], _PADDING[o.padding],
                     dilations=[1, o.dilationHFactor, o.dilationWFactor, 1])
    if len(ins) > 2 and ins[2] is not None:
        y = y + ins[2]
    return _activation(y, o.fusedActivationFunction)


def _depthwise(op, ins, tensors, constants, idx):
    o = op.builtinOptions
    channels = ins[0].shape[-1]
    kh, kw = ins[1].shape[1], ins[1].shape[2]
    kernel = tf.reshape(ins[1], [kh, kw, channels, -1])
    y = tf.nn.depthwise_conv2d(ins[0], kernel, [1, o.strideH, o.strideW, 1],
                               _PADDING[o.padding],
                               dilations=[o.dilationHFactor, o.dilationWFactor])
    if len(ins) > 2 and ins[2] is not None:
        y = y + ins[2]
    return _activation(y, o.fusedActivationFunction)


def _fully_connected(op, ins, tensors, constants, idx):
    o = op.builtinOptions
    x, w = ins[0], ins[1]
    units, depth = w.shape
    flat = tf.reshape(x, [-1, depth])
    y = tf.matmul(flat, w, transpose_b=True)
    if len(ins) > 2 and ins[2] is not None:
        y = y + ins[2]
    if o is not None and o.keepNumDims:
        y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [units]], 0))
    return _activation(y, 0 if o is None else o.fusedActivationFunction)


def _binary(fn):
    def run(op, ins, tensors, constants, idx):
        o = op.builtinOptions
        y = fn(ins[0], ins[1])
        return _activation(y, getattr(o, "fusedActivationFunction", 0) if o else 0)
    return run


def _unary(fn):
    return lambda op, ins, tensors, constants, idx: fn(ins[0])


def _reduce(fn):
    def run(op, ins, tensors, constants, idx):
        axes = [int(a) for a in np.asarray(constants[idx[1]]).ravel()]
        keep = bool(op.builtinOptions.keepDims) if op.builtinOptions is not None else False
        return fn(ins[0], axis=axes, keepdims=keep)
    return run


def _reshape(op, ins, tensors, constants, idx):
    # The graph's shapes are those of a batch of 1: the output's static shape with its
    # leading dimension free holds the batch, also where a reshape folds it into the first
    # dimension (B x P patches).
    shape = tensor_indices(tensors[tensor_indices(op.outputs)[0]].shape)
    return tf.reshape(ins[0], [-1, *shape[1:]] if shape else [])


def _batch_matmul(op, ins, tensors, constants, idx):
    o = op.builtinOptions
    return tf.linalg.matmul(ins[0], ins[1], adjoint_a=bool(o.adjX), adjoint_b=bool(o.adjY))


def _softmax(op, ins, tensors, constants, idx):
    return tf.nn.softmax(ins[0] * op.builtinOptions.beta, axis=-1)


def _space_to_depth(op, ins, tensors, constants, idx):
    return tf.nn.space_to_depth(ins[0], op.builtinOptions.blockSize)


def _depth_to_space(op, ins, tensors, constants, idx):
    return tf.nn.depth_to_space(ins[0], op.builtinOptions.blockSize)


def _pad(op, ins, tensors, constants, idx):
    return tf.pad(ins[0], constants[idx[1]].astype(np.int32))


def _resize_bilinear(op, ins, tensors, constants, idx):
    o = op.builtinOptions
    size = constants[idx[1]].astype(np.int32)
    return tf.raw_ops.ResizeBilinear(images=ins[0], size=size,
                                     align_corners=bool(o.alignCorners),
                                     half_pixel_centers=bool(o.halfPixelCenters))


def _pool(fn):
    def run(op, ins, tensors, constants, idx):
        o = op.builtinOptions
        y = fn(ins[0], [1, o.filterHeight, o.filterWidth, 1], [1, o.strideH, o.strideW, 1],
               _PADDING[o.padding])
        return _activation(y, o.fusedActivationFunction)
    return run


def _concatenation(op, ins, tensors, constants, idx):
    o = op.builtinOptions
    return _activation(tf.concat(ins, axis=o.axis), o.fusedActivationFunction)


def _split(op, ins, tensors, constants, idx):
    axis = int(np.asarray(constants[idx[0]]).ravel()[0])
    return tf.split(ins[1], op.builtinOptions.numSplits, axis=axis)


def _transpose(op, ins, tensors, constants, idx):
    return tf.transpose(ins[0], constants[idx[1]].astype(np.int32))


_OPS: dict[str, Op] = {
    "CONV_2D": _conv,
    "DEPTHWISE_CONV_2D": _depthwise,
    "FULLY_CONNECTED": _fully_connected,
    "ADD": _binary(tf.add),
    "SUB": _binary(tf.subtract),
    "MUL": _binary(tf.multiply),
    "DIV": _binary(tf.divide),
    "SQUARED_DIFFERENCE": _binary(tf.math.squared_difference),
    "MAXIMUM": _binary(tf.maximum),
    "MINIMUM": _binary(tf.minimum),
    "LOGISTIC": _unary(tf.sigmoid),
    "TANH": _unary(tf.tanh),
    "EXP": _unary(tf.exp),
    "RSQRT": _unary(tf.math.rsqrt),
    "SQRT": _unary(tf.sqrt),
    "RELU": _unary(tf.nn.relu),
    "RELU6": _unary(tf.nn.relu6),
    "HARD_SWISH": _unary(lambda x: x * tf.nn.relu6(x + 3.0) / 6.0),
    "MEAN": _reduce(tf.reduce_mean),
    "SUM": _reduce(tf.reduce_sum),
    "REDUCE_MAX": _reduce(tf.reduce_max),
    "RESHAPE": _reshape,
    "BATCH_MATMUL": _batch_matmul,
    "SOFTMAX": _softmax,
    "SPACE_TO_DEPTH": _space_to_depth,
    "DEPTH_TO_SPACE": _depth_to_space,
    "PAD": _pad,
    "RESIZE_BILINEAR": _resize_bilinear,
    "AVERAGE_POOL_2D": _pool(tf.nn.avg_pool2d),
    "MAX_POOL_2D": _pool(tf.nn.max_pool2d),
    "CONCATENATION": _concatenation,
    "TRANSPOSE": _transpose,
    "SPLIT": _split,
    "ABS": _unary(tf.abs),
    "SIN": _unary(tf.sin),
    "COS": _unary(tf.cos),
    "SQUARE": _unary(tf.square),
    "RELU_N1_TO_1": _unary(lambda x: tf.clip_by_value(x, -1.0, 1.0)),
}
