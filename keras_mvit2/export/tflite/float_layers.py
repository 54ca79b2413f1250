"""Full-int8 files with chosen Keras layers kept in float (`to_tflite(float_layers=...)`).

The route: the MLIR quantizer (``tensorflow.lite.python.convert.mlir_quantize``) takes
``denylisted_nodes``: output tensor names of ops to leave in float, between a DEQUANTIZE
and a QUANTIZE (the mechanism behind
``tf.lite.experimental.QuantizationDebugOptions(denylisted_nodes=...)`` and the debugger's
``get_nondebug_quantized_model()``, which however always writes float I/O).
`selected_nodes` picks the ops of the named layers in the calibrated graph
(`LayerNames.selected`); `keras_mvit2.export.tflite.calibrated_quantize` calibrates, then
quantizes with those ops denylisted, so everything else (I/O types, uint8 I/O included,
per-channel weights) is what a plain int8 conversion gives.

`float_ops_outside` is the float-op check of such a file: the ops of the named layers and
the QUANTIZE / DEQUANTIZE at the edges of their float islands are expected; any other op
that computes in float is still an error.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import keras

from keras_mvit2.export.tflite.flatbuffer import (
    decode_name,
    op_names,
    read_flatbuffer,
    tensor_indices,
)
from keras_mvit2.export.tflite.inspect import _FLOAT_TENSOR_TYPES
from keras_mvit2.export.tflite.layer_names import LayerNames

__all__ = ["float_ops_outside", "selected_nodes"]


def selected_nodes(flatbuffer: bytes, names: LayerNames, float_layers: Sequence[str]) -> list[str]:
    """Output tensor names of the ops of `float_layers` in `flatbuffer` (main graph); a
    ValueError when a named layer has no op there."""
    model = read_flatbuffer(flatbuffer)
    tensors = model.subgraphs[0].tensors or []
    outputs = [
        decode_name(tensors[i].name)
        for op in model.subgraphs[0].operators or []
        for i in tensor_indices(op.outputs)[:1]
    ]
    nodes = [n for n in outputs if names.selected(n, float_layers)]
    empty = [layer for layer in float_layers if not any(names.selected(n, [layer]) for n in nodes)]
    if empty:
        raise ValueError(
            f"float_layers names layers with no op in the converted graph: {empty} (e.g. a "
            "dropout or input layer, or one the converter removed). Name the layers that "
            "compute, as `layer_errors` lists them."
        )
    return nodes


def float_ops_outside(
    flatbuffer: bytes, model: keras.Model, float_layers: Sequence[str]
) -> dict[str, int]:
    """Histogram of the ops that compute in float, apart from the ops of `float_layers`,
    the QUANTIZE / DEQUANTIZE at the edges of their islands and the float I/O boundary
    (the same exceptions as `TFLiteReport.float_ops`)."""
    fb = read_flatbuffer(flatbuffer)
    kinds = op_names(fb)
    names = LayerNames(model)
    counts: collections.Counter[str] = collections.Counter()
    for subgraph in fb.subgraphs or []:
        tensors = subgraph.tensors or []
        ops = list(subgraph.operators or [])
        # An op of a named layer: by its output's name or, where quantized I/O renamed the
        # output (``Identity1``), by its weights' names (constant inputs).
        allowed = {
            id(op) for op in ops
            if any(names.selected(decode_name(tensors[i].name), float_layers)
                   for i in tensor_indices(op.outputs)[:1] + [
                       j for j in tensor_indices(op.inputs)
                       if j >= 0 and _is_constant(fb, tensors[j])])
        }
        producer = {i: op for op in ops for i in tensor_indices(op.outputs)}
        consumers: dict[int, list] = collections.defaultdict(list)
        for op in ops:
            for i in tensor_indices(op.inputs):
                consumers[i].append(op)
        graph_inputs = set(tensor_indices(subgraph.inputs))
        graph_outputs = set(tensor_indices(subgraph.outputs))

        is_float = {
            i for i, t in enumerate(tensors) if int(t.type) in _FLOAT_TENSOR_TYPES
        }.__contains__
        for op in ops:
            kind = kinds[op.opcodeIndex]
            float_in = {i for i in tensor_indices(op.inputs) if is_float(i)}
            float_out = {i for i in tensor_indices(op.outputs) if is_float(i)}
            if (not float_in and not float_out) or id(op) in allowed:
                continue
            if kind == "QUANTIZE" and all(
                i in graph_inputs or id(producer.get(i)) in allowed for i in float_in
            ):
                continue
            if kind == "DEQUANTIZE" and all(
                i in graph_outputs or (consumers[i] and all(id(c) in allowed for c in consumers[i]))
                for i in float_out
            ):
                continue
            counts[kind] += 1
    return dict(sorted(counts.items()))


def _is_constant(fb, tensor) -> bool:
    buffer = fb.buffers[tensor.buffer] if 0 < tensor.buffer < len(fb.buffers or []) else None
    return buffer is not None and ((buffer.data is not None and len(buffer.data) > 0)
                                   or bool(getattr(buffer, "size", 0)))
