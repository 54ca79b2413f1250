"""Elementwise functions of one int8 tensor as 256-entry tables in a full-int8 TFLite file.

An int8 tensor holds one of 256 values, so any function of it alone is a table of 256
int8 outputs. LiteRT computes its int8 RSQRT and SQRT element by element in fixed point
(about 63 ns an element on the AMD host; `benchmarks/int8_speed.py`), and has no int8 kernel
for SIN, COS or SQUARE at all: the converter leaves those in float, between a DEQUANTIZE
and a QUANTIZE. `tabulate_elementwise` replaces such an op by three integer ops that every
LiteRT runs (about 4 ns an element):

    CAST (int8 -> int32)  ->  ADD (+128)  ->  GATHER (a constant int8 table[256])

The table holds the function of each of the 256 dequantized input values, rounded (half
away from zero, as LiteRT's QUANTIZE) to the output's scale and zero point and clamped to
int8: within a step of LiteRT's own RSQRT / SQRT (which round in fixed point), and for a
float island the values it computes (one rounding after the float function). What it
replaces:

* an int8 op of `INT8_FUNCTIONS` (RSQRT, SQRT) on at least `MIN_ELEMENTS` values: the same
  input and output tensors (what `to_tflite(quantization="int8")` does);
* with ``islands=True``, a float island: DEQUANTIZE of an int8 tensor, a chain of
  `FLOAT_FUNCTIONS` ops, a QUANTIZE to int8; or a float CONCATENATION of such chains whose
  output only a QUANTIZE reads (RFA's `[sin(z), cos(z)]`): a table per chain into the
  QUANTIZE's scale, and the CONCATENATION in int8. Not the default: GATHER looks up about
  4.6 ns an element, and XNNPACK runs such an island in float faster (RFA's features).

A function's value where it is not finite (RSQRT of 0, as LiteRT's own kernel) is the
largest int8 value; RSQRT and SQRT of a negative input are taken at 0 (the graphs here feed
them sums of squares and positive flows, which calibrate to a range starting at 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema

from keras_mvit2.export.tflite.flatbuffer import (
    add_buffer,
    add_tensor,
    drop_unused,
    new_operator,
    op_names,
    operator_code,
    tensor_indices,
    tensor_name,
)

__all__ = ["FLOAT_FUNCTIONS", "INT8_FUNCTIONS", "MIN_ELEMENTS", "table", "tabulate_elementwise"]


def _rsqrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return 1.0 / np.sqrt(np.maximum(x, 0.0))


def _sqrt(x: np.ndarray) -> np.ndarray:
    return np.sqrt(np.maximum(x, 0.0))


#: int8 ops whose LiteRT kernel computes each element in fixed point: op -> its function.
INT8_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "RSQRT": _rsqrt,
    "SQRT": _sqrt,
}
#: Float ops an island may chain (DEQUANTIZE -> these -> QUANTIZE): op -> its function.
FLOAT_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "SIN": np.sin,
    "COS": np.cos,
    "SQUARE": np.square,
    "RSQRT": _rsqrt,
    "SQRT": _sqrt,
    "ABS": np.abs,
    "NEG": np.negative,
}
#: Tensors smaller than this keep their op: three ops to dispatch cost more than the kernel's
#: per-element work on a handful of elements (the GroupNorms' one rsqrt per sample;
#: `benchmarks/int8_speed.py`, "every RSQRT a table").
MIN_ELEMENTS = 64
#: Operator codes of the table ops, with the versions TF 2.21's converter gives them.
_TABLE_OPS = (("CAST", 3), ("ADD", 1), ("GATHER", 2))
_INT8, _INT32, _FLOAT32 = (tfl_schema.TensorType.INT8, tfl_schema.TensorType.INT32,
                           tfl_schema.TensorType.FLOAT32)


def table(function: Callable[[np.ndarray], np.ndarray], input_quantization: tuple[float, int],
          output_quantization: tuple[float, int]) -> np.ndarray:
    """The int8 table of `function` from an int8 input to an int8 output, `(256,)`: entry
    `q + 128` is the output for input value `q` (quantization ``(scale, zero_point)`` each)."""
    (s_in, z_in), (s_out, z_out) = input_quantization, output_quantization
    levels = np.arange(-128, 128, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        values = function((levels - z_in) * s_in) / s_out
    values = np.where(np.isfinite(values), values, 127.0 - z_out)
    rounded = np.sign(values) * np.floor(np.abs(values) + 0.5)  # half away from zero
    return np.clip(rounded + z_out, -128, 127).astype(np.int8)


def tabulate_elementwise(model: Any, *, islands: bool = False,
                         min_elements: int = MIN_ELEMENTS) -> int:
    """Replaces the int8 RSQRT / SQRT ops and the float islands of elementwise functions of
    a full-int8 `model` (a parsed `ModelT`, changed in place) by table lookups.

    Args:
        model: the quantized flatbuffer (`parse_flatbuffer`).
        islands: also replace the float islands. Off by default: LiteRT's GATHER looks
            up about 4.6 ns an element, while XNNPACK runs a float SIN / COS island in
            well under one (RFA's random features at 256x256: the file takes 31.9 ms with
            tables, 13.7 ms with its float island; `benchmarks/int8_speed.py`).
        min_elements: int8 ops on fewer values keep their kernel (`MIN_ELEMENTS`).

    Returns:
        The number of tables written.
    """
    graph = model.subgraphs[0]
    names = op_names(model)
    writes = 0

    def lookup(source: int, target: int, function: Callable) -> list[Any]:
        """The three ops writing `function` of int8 tensor `source` into int8 `target`."""
        nonlocal writes
        writes += 1
        src, dst = graph.tensors[source], graph.tensors[target]
        values = table(function, _quantization(src), _quantization(dst))
        name = tensor_name(dst)
        shape = tensor_indices(src.shape)
        wide = add_tensor(graph, f"{name}/table_index", _INT32, shape)
        index = add_tensor(graph, f"{name}/table_index_offset", _INT32, shape)
        offset = add_tensor(graph, f"{name}/table_offset", _INT32, [],
                            add_buffer(model, np.array(128, np.int32)))
        entries = add_tensor(graph, f"{name}/table", _INT8, [256],
                             add_buffer(model, values), _copy_quantization(dst))
        cast = new_operator(operator_code(model, *_TABLE_OPS[0]), [source], [wide],
                            tfl_schema.BuiltinOptions.CastOptions, _cast_options())
        add = new_operator(operator_code(model, *_TABLE_OPS[1]), [wide, offset], [index],
                           tfl_schema.BuiltinOptions.AddOptions, tfl_schema.AddOptionsT())
        gather = new_operator(operator_code(model, *_TABLE_OPS[2]), [entries, index],
                              [target], tfl_schema.BuiltinOptions.GatherOptions,
                              tfl_schema.GatherOptionsT())
        return [cast, add, gather]

    producers = {t: i for i, op in enumerate(graph.operators)
                 for t in tensor_indices(op.outputs)}
    readers: dict[int, int] = {}
    for op in graph.operators:
        for t in tensor_indices(op.inputs):
            readers[t] = readers.get(t, 0) + 1
    outputs = set(tensor_indices(graph.outputs))

    def chain(tensor: int) -> tuple[int, Callable] | None:
        """`(int8 source, function)` where `tensor` is a float chain of `FLOAT_FUNCTIONS`
        from a DEQUANTIZE of an int8 tensor, each link read only by the next; else None."""
        functions = []
        while tensor not in outputs and tensor in producers:
            op = graph.operators[producers[tensor]]
            kind, ins = names[op.opcodeIndex], tensor_indices(op.inputs)
            if kind == "DEQUANTIZE":  # the island's entry (other ops may read it too)
                return (ins[0], _compose(functions)) if _int8(graph, ins[0]) else None
            if kind not in FLOAT_FUNCTIONS or (functions and readers.get(tensor) != 1):
                return None
            functions.append(FLOAT_FUNCTIONS[kind])
            tensor = ins[0]
        return None

    replaced: dict[int, list[Any]] = {}   # op index -> the ops that take its place
    for index, op in enumerate(graph.operators):
        kind, ins, outs = names[op.opcodeIndex], tensor_indices(op.inputs), tensor_indices(
            op.outputs)
        if kind in INT8_FUNCTIONS and _int8(graph, ins[0]) and _int8(graph, outs[0]) and (
                _elements(graph, ins[0]) >= min_elements):
            replaced[index] = lookup(ins[0], outs[0], INT8_FUNCTIONS[kind])
        elif islands and kind == "QUANTIZE" and _int8(graph, outs[0]) and (
                graph.tensors[ins[0]].type == _FLOAT32) and readers.get(ins[0]) == 1:
            replaced.update(_island(graph, names, producers, ins[0], outs[0], chain, lookup,
                                    index))
    if not replaced:
        return 0
    operators = []
    for index, op in enumerate(graph.operators):
        operators.extend(replaced.get(index, [op]))
    graph.operators = operators
    _drop_dead_ops(graph, outputs)
    drop_unused(model)
    return writes


def _island(graph, names, producers, value: int, target: int, chain, lookup,
            quantize_index: int) -> dict[int, list[Any]]:
    """The replacements for a QUANTIZE (at `quantize_index`) of float `value` into int8
    `target`: tables where `value` is a chain or a CONCATENATION of chains; else none."""
    found = chain(value)
    if found is not None:
        return {quantize_index: lookup(found[0], target, found[1])}
    if value not in producers:
        return {}
    concat_index = producers[value]
    concat = graph.operators[concat_index]
    if names[concat.opcodeIndex] != "CONCATENATION":
        return {}
    parts = [chain(t) for t in tensor_indices(concat.inputs)]
    if any(p is None for p in parts):
        return {}
    ops, inputs = [], []
    for i, (source, function) in enumerate(parts):
        part = add_tensor(graph, f"{tensor_name(graph.tensors[target])}/part_{i}", _INT8,
                          tensor_indices(graph.tensors[source].shape),
                          quantization=_copy_quantization(graph.tensors[target]))
        ops += lookup(source, part, function)
        inputs.append(part)
    int8_concat = new_operator(concat.opcodeIndex, inputs, [target],
                               tfl_schema.BuiltinOptions.ConcatenationOptions,
                               concat.builtinOptions)
    # The new ops take the QUANTIZE's place (after every input is written).
    return {quantize_index: ops + [int8_concat]}


def _drop_dead_ops(graph, outputs: set[int]) -> None:
    """Removes ops none of whose outputs is read (the islands' float ops), repeatedly."""
    while True:
        read = {t for op in graph.operators for t in tensor_indices(op.inputs)} | outputs
        kept = [op for op in graph.operators if any(t in read for t in tensor_indices(op.outputs))]
        if len(kept) == len(graph.operators):
            return
        graph.operators = kept


def _compose(functions: list[Callable]) -> Callable:
    """The chain's function: `functions` were collected from the output back to the input."""
    def composed(x: np.ndarray) -> np.ndarray:
        for function in reversed(functions):
            x = function(x)
        return x
    return composed


def _cast_options() -> Any:
    options = tfl_schema.CastOptionsT()
    options.inDataType, options.outDataType = _INT8, _INT32
    return options


def _elements(graph, tensor: int) -> int:
    return int(np.prod(tensor_indices(graph.tensors[tensor].shape)))


def _int8(graph, tensor: int) -> bool:
    t = graph.tensors[tensor]
    return t.type == _INT8 and _quantization(t) is not None


def _quantization(tensor) -> tuple[float, int] | None:
    q = tensor.quantization
    if q is None or q.scale is None or len(q.scale) != 1:
        return None
    return float(q.scale[0]), int(q.zeroPoint[0])


def _copy_quantization(tensor) -> Any:
    scale, zero_point = _quantization(tensor)
    q = tfl_schema.QuantizationParametersT()
    q.scale = np.array([scale], np.float32)
    q.zeroPoint = np.array([zero_point], np.int64)
    return q
