"""The full-int8 file rewritten for LiteRT's fast int8 kernels, after quantization.

`for_fast_kernels(model)` is what both roads to a full-int8 `.tflite` run on the quantized
flatbuffer (`to_tflite(quantization="int8")`, and the PyTorch road's ai-edge-quantizer
file), where a choice of representation, not of values, decides which kernel LiteRT runs:

* `symmetric_constant_matmul_operands`: a constant second operand of a BATCH_MATMUL at zero
  point 0, so that XNNPACK takes the product (its activations got theirs before
  quantization: `keras_mvit2.export.tflite.activation_ranges.zero_offset_matmul_operands`);
* `keras_mvit2.export.tflite.lookup_tables.tabulate_elementwise`: the int8 RSQRT / SQRT,
  which LiteRT computes per element in fixed point, as 256-entry tables.

The per-op times behind each: `benchmarks/int8_speed.py`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keras_mvit2.export.tflite.flatbuffer import constant_array, op_names, tensor_indices
from keras_mvit2.export.tflite.lookup_tables import tabulate_elementwise

__all__ = ["for_fast_kernels", "symmetric_constant_matmul_operands"]


def for_fast_kernels(model: Any) -> dict[str, int]:
    """Rewrites a parsed full-int8 flatbuffer (`parse_flatbuffer`) in place for LiteRT's fast
    kernels (see the module docstring); what it changed: ``{"constants": ..., "tables": ...}``."""
    return {"constants": symmetric_constant_matmul_operands(model),
            "tables": tabulate_elementwise(model)}


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
