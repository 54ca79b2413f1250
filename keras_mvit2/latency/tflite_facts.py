"""Facts read from a ``.tflite`` flatbuffer: MACs (`tflite_macs`) and the precision
(`tflite_precision`)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema

from keras_mvit2.export.tflite.flatbuffer import TENSOR_TYPE_NAMES, op_names, read_flatbuffer

_MAC_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL")


def _shape(tensor: Any) -> list[int]:
    return [] if tensor.shape is None else [int(d) for d in tensor.shape]


def _op_macs(name: str, op: Any, tensors: list[Any]) -> int:
    inputs = [] if op.inputs is None else [int(i) for i in op.inputs]
    outputs = [] if op.outputs is None else [int(i) for i in op.outputs]
    if not outputs or len(inputs) < 2:
        return 0
    out = int(np.prod(_shape(tensors[outputs[0]]), dtype=np.int64))
    weights = _shape(tensors[inputs[1]])
    if name == "CONV_2D":            # filter (out, kh, kw, in / groups)
        return out * int(np.prod(weights[1:], dtype=np.int64))
    if name == "DEPTHWISE_CONV_2D":  # filter (1, kh, kw, out)
        return out * weights[1] * weights[2]
    if name == "FULLY_CONNECTED":    # weights (units, in)
        return out * weights[-1]
    if name == "BATCH_MATMUL":       # (..., m, k) x (..., k, n)
        lhs = _shape(tensors[inputs[0]])
        options = op.builtinOptions
        adj_x = bool(getattr(options, "adjX", False))
        return out * (lhs[-2] if adj_x else lhs[-1])
    return 0


def tflite_macs(path: str | os.PathLike | bytes) -> int | None:
    """Multiply-accumulates of one batch-1 inference, from the flatbuffer's shapes.

    Counts CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED and BATCH_MATMUL (output
    elements times the reduction length), the convention of
    `keras_mvit2.profiling.count_macs`; element-wise ops are not counted. Returns
    ``None`` (unknown) when a counted op has a dynamic (``-1``) dimension or the
    model has control-flow subgraphs, whose trip counts are unknown.
    """
    model = read_flatbuffer(path)
    names = op_names(model)
    if len(model.subgraphs or []) != 1:
        return None
    graph = model.subgraphs[0]
    tensors = graph.tensors or []
    total = 0
    for op in graph.operators or []:
        name = names[op.opcodeIndex]
        if name not in _MAC_OPS:
            continue
        ids = [int(i) for i in list(op.inputs)[:2]] + [int(i) for i in list(op.outputs)[:1]]
        for i in ids:
            signature = tensors[i].shapeSignature
            if signature is not None and any(int(d) < 0 for d in list(signature)[1:]):
                return None
        total += _op_macs(name, op, tensors)
    return int(total)


def tflite_precision(path: str | os.PathLike) -> str:
    """``"float32"``, ``"float16"``, ``"dynamic_int8"``, ``"int8"`` or ``"int16x8"``.

    Read from the keras_mvit2 metadata when the file has it, otherwise from the
    tensor types of the first convolution / fully-connected op.
    """
    from keras_mvit2.export.tflite.metadata import read_tflite_metadata

    info = read_tflite_metadata(path)
    if info and info.get("quantization"):
        return str(info["quantization"])
    model = read_flatbuffer(path)
    names = op_names(model)
    graph = model.subgraphs[0]
    tensors = graph.tensors
    has_fp16 = any(int(t.type) == tfl_schema.TensorType.FLOAT16 for t in tensors)
    for op in graph.operators or []:
        if names[op.opcodeIndex] not in _MAC_OPS:
            continue
        activation = TENSOR_TYPE_NAMES.get(int(tensors[int(op.inputs[0])].type), "")
        weight = TENSOR_TYPE_NAMES.get(int(tensors[int(op.inputs[1])].type), "")
        if activation in ("int8", "uint8"):
            return "int8"
        if activation == "int16":
            return "int16x8"
        if weight in ("int8", "uint8"):
            return "dynamic_int8"
        break
    return "float16" if has_fp16 else "float32"
