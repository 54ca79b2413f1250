"""The full-int8 file rewritten for LiteRT's fast int8 kernels, after quantization.

`for_fast_kernels(model)` is what both roads to a full-int8 `.tflite` run on the quantized
flatbuffer (`to_tflite(quantization="int8")`, and the PyTorch road's ai-edge-quantizer
file), where a choice of representation, not of values, decides which kernel LiteRT runs:

* `symmetric_constant_matmul_operands`: a constant second operand of a BATCH_MATMUL at zero
  point 0, so that XNNPACK takes the product (its activations got theirs before
  quantization: `keras_mvit2.export.tflite.activation_ranges.zero_offset_matmul_operands`);
* `keras_mvit2.export.tflite.lookup_tables.tabulate_elementwise`: the int8 RSQRT / SQRT,
  which LiteRT computes per element in fixed point, as 256-entry tables;
* `float_softmax_islands`, only for a file that may hold float ops (`to_tflite`'s
  ``allow_float_ops=True``): the attention weights' SOFTMAX computed in float inside
  XNNPACK, entered and left by a DEQUANTIZE / QUANTIZE of the int8 tensors it had.

The per-op times behind each: `benchmarks/int8_speed.py`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema

from keras_mvit2.export.tflite.flatbuffer import (
    add_tensor,
    constant_array,
    new_operator,
    op_names,
    operator_code,
    tensor_indices,
    tensor_name,
)
from keras_mvit2.export.tflite.lookup_tables import MIN_ELEMENTS, tabulate_elementwise

_INT8, _FLOAT32 = tfl_schema.TensorType.INT8, tfl_schema.TensorType.FLOAT32

__all__ = ["float_softmax_islands", "for_fast_kernels", "symmetric_constant_matmul_operands"]

#: Operator codes of a float island's edges, with the versions TF 2.21's converter gives them.
_ISLAND_EDGES = (("DEQUANTIZE", 2), ("QUANTIZE", 2))


def for_fast_kernels(model: Any, *, float_softmax: bool = False) -> dict[str, int]:
    """Rewrites a parsed full-int8 flatbuffer (`parse_flatbuffer`) in place for LiteRT's fast
    kernels (see the module docstring); what it changed: ``{"constants": ..., "tables": ...,
    "float_softmax": ...}``. `float_softmax`: also `float_softmax_islands` (a mixed file)."""
    return {"constants": symmetric_constant_matmul_operands(model),
            "tables": tabulate_elementwise(model),
            "float_softmax": float_softmax_islands(model) if float_softmax else 0}


def float_softmax_islands(model: Any, *, min_elements: int = MIN_ELEMENTS) -> int:
    """Computes each int8 SOFTMAX of at least `min_elements` values in float: a DEQUANTIZE of
    its int8 input, the SOFTMAX in float, a QUANTIZE into its int8 output (the same tensors,
    scales and zero points, so nothing else in the graph changes).

    LiteRT's int8 SOFTMAX is its own kernel, outside XNNPACK and on one thread whatever the
    thread count; XNNPACK takes all three ops of the island (and the partitions either side
    join). MobileViTV2-0.5 with MHA at 256x256 on the Intel host: the integer-only file
    takes 1.44x / 1.92x the island file's time at 1 / 2 threads, and only the island file is
    faster than its float32 file at 2 threads (0.70x; Linformer: 2.06x, 0.69x;
    `benchmarks/results/int8_speed_intel/`). The island reads the same int8 scores
    and writes the same int8 weights; LiteRT's kernel computes the exponentials in fixed
    point, the island in float, so a weight may differ by one step (1/256).

    Not for an integer-only accelerator, which cannot run the float ops; `to_tflite` writes
    these islands only where float ops are allowed. Smaller SOFTMAX ops (a classifier's
    output) keep their kernel, as the tables do (`MIN_ELEMENTS`).

    Returns:
        The number of SOFTMAX ops moved into float.
    """
    graph = model.subgraphs[0]
    names = op_names(model)
    operators, moved = [], 0
    for op in graph.operators or []:
        ins, outs = tensor_indices(op.inputs), tensor_indices(op.outputs)
        shape = tensor_indices(graph.tensors[ins[0]].shape) if ins else []
        if (names[op.opcodeIndex] != "SOFTMAX" or graph.tensors[ins[0]].type != _INT8
                or graph.tensors[outs[0]].type != _INT8 or int(np.prod(shape)) < min_elements):
            operators.append(op)
            continue
        target = graph.tensors[outs[0]]
        name = tensor_name(target)
        scores = add_tensor(graph, f"{name}/float_scores", _FLOAT32, shape)
        weights = add_tensor(graph, f"{name}/float_weights", _FLOAT32, shape)
        operators.append(new_operator(operator_code(model, *_ISLAND_EDGES[0]), [ins[0]],
                                      [scores]))
        op.inputs = np.asarray([scores], np.int32)
        op.outputs = np.asarray([weights], np.int32)
        operators.append(op)
        operators.append(new_operator(operator_code(model, *_ISLAND_EDGES[1]), [weights],
                                      [outs[0]]))
        moved += 1
    graph.operators = operators
    return moved


def symmetric_constant_matmul_operands(model: Any) -> int:
    """Requantizes each constant int8 second operand of a BATCH_MATMUL of a quantized
    flatbuffer to zero point 0, so that XNNPACK takes the product (see
    `activation_ranges.zero_offset_matmul_operands`; RFA's random projections measured
    1.9 ms in LiteRT's kernel against 0.1 ms in XNNPACK, one `(4, 4, 256, 16) x (4, 16, 64)`
    product).

    The converter quantizes a constant BATCH_MATMUL operand as an activation (asymmetric,
    after the calibration), so its range cannot be chosen before quantization as
    `zero_offset_matmul_operands` does for the others: its values are requantized here
    with the scale ``max |value| / 127`` and zero point 0 (at most one bit coarser; the
    product's output scale is derived from the operands' scales at run time).

    Args:
        model: a parsed quantized flatbuffer, changed in place.

    Returns:
        The number of constants requantized.
    """
    subgraph = model.subgraphs[0]
    kinds = op_names(model)
    done = set()
    for op in subgraph.operators or []:
        ins = tensor_indices(op.inputs)
        if kinds[op.opcodeIndex] != "BATCH_MATMUL" or len(ins) < 2 or ins[1] in done:
            continue
        tensor = subgraph.tensors[ins[1]]
        values = constant_array(model, tensor)
        q = tensor.quantization
        if values is None or values.dtype != np.int8 or q is None or q.scale is None or len(
                q.scale) != 1 or int(q.zeroPoint[0]) == 0:
            continue
        real = (values.astype(np.float64) - int(q.zeroPoint[0])) * float(q.scale[0])
        scale = max(float(np.abs(real).max()) / 127.0, 1e-12)
        requantized = np.clip(np.round(real / scale), -127, 127).astype(np.int8)
        model.buffers[tensor.buffer].data = np.frombuffer(requantized.tobytes(), np.uint8)
        q.scale = np.array([scale], np.float32)
        q.zeroPoint = np.array([0], np.int64)
        done.add(ins[1])
    return len(done)
