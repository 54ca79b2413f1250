"""Fuse back-to-back 1x1 convolutions of a float TFLite model into one (an exact rewrite).

Two 1x1 convolutions with nothing non-linear between them are one linear map:
``W_b (W_a x + b_a) + b_b = (W_b W_a) x + (W_b b_a + b_b)``. After batch-norm folding,
MobileViTv2 has three such pairs: the projection of the first inverted residual
(``stage0_block0``, 32 -> 32 channels at 128x128 for width 0.5) and the projections that
end the MobileViT blocks of ``stage2`` and ``stage3`` (``conv_proj``: d -> C), each
followed by the expansion of the next stride-2 inverted residual (C -> 2C). One
product, ``in x out``, costs fewer multiply-accumulates than ``in x mid + mid x out``
whenever the middle is not the narrowest side (figures: docs/benchmarks.md).

The rewrite runs on the converted flatbuffer, after TensorFlow folded the batch norms
into the convolutions, so it sees the graph that will run. It fuses a pair only when
it cannot change the model's function:

* the first convolution is 1x1, stride 1, with no fused activation, and its output is
  not a model output and is read by exactly one op: the second convolution's input;
* the second convolution is 1x1, stride 1 (any fused activation);
* weights and biases are constants of the model (float32, or float16 behind a
  DEQUANTIZE as in ``quantization="float16"`` files);
* activations are float (not quantized) and the product has fewer MACs.

The products are taken in float64 and stored, in the weights' type, in new constant
tensors (the converter shares equal constants between ops, so none is edited in place);
outputs agree with the unfused model to float32 rounding (~1e-7 relative). Orphaned
tensors, buffers and weight DEQUANTIZE ops are removed, so the file also gets smaller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema

from keras_mvit2.export.tflite.flatbuffer import (
    NUMPY_DTYPES,
    add_buffer,
    add_tensor,
    constant_array,
    decode_name,
    drop_unused,
    op_names,
    parse_flatbuffer,
    serialize_flatbuffer,
    tensor_indices,
)

__all__ = [
    "PointwiseFusion", "fuse_pointwise_convolutions", "fuse_pointwise_pairs", "fusion_saves_macs",
]

_FLOAT32 = tfl_schema.TensorType.FLOAT32
_FLOAT16 = tfl_schema.TensorType.FLOAT16


@dataclass(frozen=True)
class PointwiseFusion:
    """One pair of 1x1 convolutions fused into one.

    Attributes:
        first: name of the first convolution's output tensor (it no longer exists),
            up to its first ``;`` (TensorFlow joins the names of fused ops with ``;``).
        second: name of the fused convolution's output tensor, likewise.
        channels: ``(in, mid, out)`` channels of the pair; the fused one maps in -> out.
        macs_saved: multiply-accumulates per inference saved by the fusion.
    """

    first: str
    second: str
    channels: tuple[int, int, int]
    macs_saved: int


def fusion_saves_macs(cin: int, mid: int, cout: int) -> bool:
    """Whether one `cin -> cout` 1x1 convolution costs fewer MACs than `cin -> mid -> cout`."""
    return cin * cout < mid * (cin + cout)


def fuse_pointwise_convolutions(flatbuffer: bytes) -> tuple[bytes, list[PointwiseFusion]]:
    """Fuses every eligible pair of back-to-back 1x1 CONV_2D ops (see the module doc).

    Args:
        flatbuffer: a `.tflite` model's bytes.

    Returns:
        The rewritten model's bytes (the input bytes unchanged when nothing is fused)
        and one `PointwiseFusion` per fused pair, in graph order.
    """
    model = parse_flatbuffer(flatbuffer)
    fusions = fuse_pointwise_pairs(model)
    if not fusions:
        return flatbuffer, []
    return serialize_flatbuffer(model, len(flatbuffer) + 4096), fusions


def fuse_pointwise_pairs(model: Any) -> list[PointwiseFusion]:
    """`fuse_pointwise_convolutions` on a parsed model (`ModelT`, edited in place): one
    `PointwiseFusion` per fused pair, in graph order."""
    names = op_names(model)
    fusions: list[PointwiseFusion] = []
    for subgraph in model.subgraphs or []:
        while True:
            fusion = _fuse_one(model, subgraph, names)
            if fusion is None:
                break
            fusions.append(fusion)
    if fusions:
        drop_unused(model)
    return fusions


# --------------------------------------------------------------------------------------
# Matching


class _Graph:
    """Producers and readers of each tensor of one subgraph."""

    def __init__(self, subgraph: Any):
        self.producer: dict[int, int] = {}
        self.readers: dict[int, list[int]] = {}
        for index, op in enumerate(subgraph.operators or []):
            for t in tensor_indices(op.outputs):
                self.producer[t] = index
            for t in tensor_indices(op.inputs):
                if t >= 0:
                    self.readers.setdefault(t, []).append(index)
        self.outputs = set(tensor_indices(subgraph.outputs))

    def only_reader(self, tensor: int) -> int | None:
        readers = self.readers.get(tensor, [])
        if tensor in self.outputs or len(readers) != 1:
            return None
        return readers[0]


@dataclass
class _Constant:
    """A constant operand: the tensor holding its data (behind a DEQUANTIZE or not)."""

    tensor: int
    dequantize_op: int | None


def _constant(model, subgraph, graph: _Graph, names, tensor: int) -> _Constant | None:
    """The constant behind `tensor` (a weight or a float16 weight's DEQUANTIZE), or None."""
    if tensor < 0 or tensor in graph.outputs:
        return None
    source, dequantize = tensor, None
    if tensor in graph.producer:
        op = subgraph.operators[graph.producer[tensor]]
        if names[op.opcodeIndex] != "DEQUANTIZE":
            return None
        dequantize = graph.producer[tensor]
        source = tensor_indices(op.inputs)[0]
        if source in graph.producer:
            return None
    t = subgraph.tensors[source]
    if t.type not in (_FLOAT32, _FLOAT16) or _has_quantization(t):
        return None
    if constant_array(model, t) is None:
        return None
    return _Constant(source, dequantize)


def _value(model, subgraph, constant: _Constant) -> np.ndarray:
    return constant_array(model, subgraph.tensors[constant.tensor])


def _new_constant(model, subgraph, like: _Constant, value: np.ndarray, name: str,
                  before: int) -> int:
    """A new constant tensor holding `value` in `like`'s type, behind a new DEQUANTIZE
    (inserted at op index `before`) when `like` has one; returns the tensor to read.

    New tensors, never edited ones: the converter shares equal constants (e.g. all-zero
    biases) between ops, so editing one in place could change another op.
    """
    template = subgraph.tensors[like.tensor]
    buffer = add_buffer(model, value.astype(NUMPY_DTYPES[template.type]))
    source = add_tensor(subgraph, name, template.type, value.shape, buffer)
    if like.dequantize_op is None:
        return source
    output = add_tensor(subgraph, name + "/dequantize", _FLOAT32, value.shape, 0)
    dequantize = tfl_schema.OperatorT()
    dequantize.opcodeIndex = subgraph.operators[like.dequantize_op].opcodeIndex
    dequantize.inputs = np.asarray([source], dtype=np.int32)
    dequantize.outputs = np.asarray([output], dtype=np.int32)
    subgraph.operators.insert(before, dequantize)
    return output


def _is_float_activation(subgraph, tensor: int) -> bool:
    t = subgraph.tensors[tensor]
    return t.type == _FLOAT32 and not _has_quantization(t)


def _has_quantization(tensor) -> bool:
    q = tensor.quantization
    return q is not None and q.scale is not None and len(q.scale) > 0


def _pointwise_conv(subgraph, names, index: int) -> bool:
    op = subgraph.operators[index]
    if names[op.opcodeIndex] != "CONV_2D":
        return False
    options = op.builtinOptions
    inputs = tensor_indices(op.inputs)
    if options.strideH != 1 or options.strideW != 1 or len(inputs) < 3 or inputs[2] < 0:
        return False
    kernel = subgraph.tensors[inputs[1]]
    return tuple(tensor_indices(kernel.shape)[1:3]) == (1, 1) and all(
        _is_float_activation(subgraph, t) for t in (inputs[0], tensor_indices(op.outputs)[0])
    )


def _fuse_one(model, subgraph, names) -> PointwiseFusion | None:
    """Finds and fuses the first eligible pair; None when there is none left."""
    graph = _Graph(subgraph)
    operators = subgraph.operators or []
    for first_index, first in enumerate(operators):
        if not _pointwise_conv(subgraph, names, first_index):
            continue
        if first.builtinOptions.fusedActivationFunction != tfl_schema.ActivationFunctionType.NONE:
            continue
        middle = tensor_indices(first.outputs)[0]
        second_index = graph.only_reader(middle)
        if second_index is None or not _pointwise_conv(subgraph, names, second_index):
            continue
        second = operators[second_index]
        if tensor_indices(second.inputs)[0] != middle:
            continue
        constants = [
            _constant(model, subgraph, graph, names, tensor_indices(op.inputs)[i])
            for op in (first, second)
            for i in (1, 2)
        ]
        if any(c is None for c in constants):
            continue
        kernel_a, bias_a, kernel_b, bias_b = constants
        w_a = _value(model, subgraph, kernel_a).astype(np.float64)[:, 0, 0, :]   # (mid, in)
        w_b = _value(model, subgraph, kernel_b).astype(np.float64)[:, 0, 0, :]   # (out, mid)
        (mid, cin), cout = w_a.shape, w_b.shape[0]
        if not fusion_saves_macs(cin, mid, cout):
            continue
        b_a = _value(model, subgraph, bias_a).astype(np.float64)
        b_b = _value(model, subgraph, bias_b).astype(np.float64)
        output = tensor_indices(second.outputs)[0]
        out_shape = tensor_indices(subgraph.tensors[output].shape)
        fusion = PointwiseFusion(
            first=_name(subgraph.tensors[middle]),
            second=_name(subgraph.tensors[output]),
            channels=(cin, mid, cout),
            macs_saved=int(np.prod(out_shape[:-1])) * (mid * (cin + cout) - cin * cout),
        )
        name = f"{fusion.second}/fused_pointwise"
        subgraph.operators.pop(first_index)                    # `second` moves up by one
        second_index -= 1
        kernel = _new_constant(model, subgraph, kernel_b, (w_b @ w_a).reshape(cout, 1, 1, cin),
                               name + "/kernel", second_index)
        second_index += kernel_b.dequantize_op is not None
        bias = _new_constant(model, subgraph, bias_b, w_b @ b_a + b_b, name + "/bias",
                             second_index)
        second.inputs = np.asarray([tensor_indices(first.inputs)[0], kernel, bias],
                                   dtype=np.int32)
        _drop_dead_dequantize(subgraph, names)
        return fusion
    return None


def _name(tensor) -> str:
    return decode_name(tensor.name).split(";")[0]


# --------------------------------------------------------------------------------------
# Clean-up


def _drop_dead_dequantize(subgraph, names: list[str]) -> None:
    """Removes DEQUANTIZE ops whose output nothing reads (weights no op uses any more)."""
    graph = _Graph(subgraph)
    subgraph.operators = [
        op for op in subgraph.operators
        if names[op.opcodeIndex] != "DEQUANTIZE"
        or any(t in graph.readers or t in graph.outputs for t in tensor_indices(op.outputs))
    ]
