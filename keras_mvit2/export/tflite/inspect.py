"""What a `.tflite` file holds: `TFLiteReport` / `inspect_tflite`, read from the flatbuffer.

The op histogram, tensor ranks, main-graph inputs and outputs, the ops that compute in float
and the keras_mvit2 metadata come from the flatbuffer itself (`summarize_flatbuffer`, no
TensorFlow import); the I/O details and the XNNPACK partitioning from an ``ai_edge_litert``
interpreter with its default delegates (`inspect_tflite`).
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

from ai_edge_litert import schema_py_generated as tfl_schema
from ai_edge_litert.interpreter import Interpreter

from keras_mvit2.export.tflite.flatbuffer import (
    BUILTIN_NAMES,
    op_names,
    read_flatbuffer,
    tensor_indices,
)
from keras_mvit2.export.tflite.metadata import _metadata_entry
from keras_mvit2.export.tflite.tensors import TensorDetails, io_tensors

__all__ = ["TFLiteReport", "TensorDetails", "inspect_tflite", "summarize_flatbuffer"]

_FLOAT_TENSOR_TYPES = frozenset(
    getattr(tfl_schema.TensorType, name)
    for name in ("FLOAT32", "FLOAT16", "FLOAT64", "BFLOAT16")
    if hasattr(tfl_schema.TensorType, name)
)


@dataclasses.dataclass
class TFLiteReport:
    """What a `.tflite` file contains and how XNNPACK partitions it.

    Attributes:
        path: the file.
        size_bytes: file size.
        op_histogram: op name -> number of ops, over all subgraphs, sorted by op
            name. Builtins by name (``"CONV_2D"``), custom ops by their custom code
            (Flex ops are ``"Flex<TfOp>"``).
        max_tensor_rank: largest rank of any tensor in the file.
        flex_ops: the Flex (SELECT_TF_OPS) ops, sorted; ``[]`` for a builtin-only model.
        custom_ops: the other custom ops (not Flex), sorted.
        inputs: the model inputs.
        outputs: the model outputs.
        dynamic_batch: True when the batch dimension of the first input is ``-1``.
        num_xnnpack_partitions: DELEGATE nodes after the interpreter applied its
            default delegates (XNNPACK on CPU). ``None`` if the file cannot be
            loaded by ``ai_edge_litert`` (e.g. it needs Flex ops).
        num_ops_outside_xnnpack: ops that still run on the plain TFLite kernels.
        ops_outside_xnnpack: histogram of those ops, sorted by op name.
        float_ops: histogram of the ops that compute in floating point (an input or
            output tensor of type float32/float16/float64/bfloat16), except a QUANTIZE
            of a float model input and a DEQUANTIZE to a float model output. For a
            float model that is nearly every op; for a full-integer model it lists the
            ops left in float (``{}`` when fully quantized).
        metadata: the ``"keras_mvit2"`` JSON metadata entry (see `to_tflite`), or
            ``None`` for a file without it.
    """

    path: str
    size_bytes: int
    op_histogram: dict[str, int]
    max_tensor_rank: int
    flex_ops: list[str]
    custom_ops: list[str]
    inputs: list[TensorDetails]
    outputs: list[TensorDetails]
    dynamic_batch: bool
    num_xnnpack_partitions: int | None
    num_ops_outside_xnnpack: int | None
    ops_outside_xnnpack: dict[str, int] | None
    float_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    metadata: dict[str, Any] | None = None

    @property
    def num_ops(self) -> int:
        """Total number of ops in the file."""
        return sum(self.op_histogram.values())

    @property
    def input_dtype(self) -> str | None:
        """The first input's type (``"float32"``, ``"int8"``, ...)."""
        return self.inputs[0].dtype if self.inputs else None

    @property
    def output_dtype(self) -> str | None:
        """The first output's type."""
        return self.outputs[0].dtype if self.outputs else None

    @property
    def num_ops_in_xnnpack(self) -> int | None:
        """Ops that XNNPACK took (``num_ops - num_ops_outside_xnnpack``)."""
        if self.num_ops_outside_xnnpack is None:
            return None
        return self.num_ops - self.num_ops_outside_xnnpack

    @property
    def quantization(self) -> str | None:
        """The quantization recorded in the metadata (``None`` without metadata)."""
        return (self.metadata or {}).get("quantization")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict of the report."""
        out = dataclasses.asdict(self)
        out["inputs"] = [t.to_dict() for t in self.inputs]
        out["outputs"] = [t.to_dict() for t in self.outputs]
        out["num_ops"] = self.num_ops
        out["num_ops_in_xnnpack"] = self.num_ops_in_xnnpack
        return out


class _FlatbufferSummary(NamedTuple):
    histogram: dict[str, int]
    max_rank: int
    inputs: list[TensorDetails]
    outputs: list[TensorDetails]
    float_ops: dict[str, int]
    metadata: dict[str, Any] | None


def _read_flatbuffer(path: str) -> _FlatbufferSummary:
    """Op histogram (all subgraphs), max tensor rank, main-graph I/O, float ops and the
    keras_mvit2 metadata, from the file itself."""
    with open(path, "rb") as f:
        return summarize_flatbuffer(f.read())


def summarize_flatbuffer(buf: bytes) -> _FlatbufferSummary:
    model = read_flatbuffer(buf)
    names = op_names(model)
    counts: collections.Counter[str] = collections.Counter()
    max_rank = 0
    for subgraph in model.subgraphs or []:
        for op in subgraph.operators or []:
            counts[names[op.opcodeIndex]] += 1
        for tensor in subgraph.tensors or []:
            shape = tensor.shapeSignature if tensor.shapeSignature is not None else tensor.shape
            max_rank = max(max_rank, 0 if shape is None else len(shape))
    inputs, outputs = io_tensors(model)
    return _FlatbufferSummary(
        dict(sorted(counts.items())),
        max_rank,
        inputs,
        outputs,
        _float_ops(model, names),
        _metadata_entry(model, buf),
    )


def _float_ops(model, names: list[str] | None = None) -> dict[str, int]:
    """Histogram of the ops with a float input or output tensor, over all subgraphs.

    Not counted: a QUANTIZE whose float inputs are all inputs of its subgraph, and a
    DEQUANTIZE whose float outputs are all outputs of its subgraph (the float I/O
    boundary of a full-integer model with float I/O).
    """
    names = op_names(model) if names is None else names
    counts: collections.Counter[str] = collections.Counter()
    for subgraph in model.subgraphs or []:
        tensors = subgraph.tensors or []
        graph_inputs = set(tensor_indices(subgraph.inputs))
        graph_outputs = set(tensor_indices(subgraph.outputs))
        for op in subgraph.operators or []:
            name = names[op.opcodeIndex]
            float_in = {
                i for i in tensor_indices(op.inputs)
                if i >= 0 and int(tensors[i].type) in _FLOAT_TENSOR_TYPES
            }
            float_out = {
                i for i in tensor_indices(op.outputs)
                if i >= 0 and int(tensors[i].type) in _FLOAT_TENSOR_TYPES
            }
            if not float_in and not float_out:
                continue
            if name == "QUANTIZE" and not float_out and float_in <= graph_inputs:
                continue
            if name == "DEQUANTIZE" and not float_in and float_out <= graph_outputs:
                continue
            counts[name] += 1
    return dict(sorted(counts.items()))


def _format_histogram(histogram: Mapping[str, int]) -> str:
    return ", ".join(f"{name} x{count}" for name, count in histogram.items())


def _xnnpack_coverage(interpreter: Interpreter) -> tuple[int, dict[str, int]]:
    """(DELEGATE nodes, histogram of ops executed outside them).

    ``_get_ops_details()`` lists the original nodes followed by the DELEGATE nodes
    that replaced some of them in the execution plan. A node runs outside the
    delegates if a graph output depends on it through nodes that are not
    replaced; walking back from the outputs with "the last node that produces a
    tensor is its producer" finds them (the DELEGATE nodes come last).
    """
    ops = interpreter._get_ops_details()
    producer: dict[int, dict[str, Any]] = {}
    for op in ops:
        for t in op["outputs"]:
            producer[int(t)] = op
    num_delegates = sum(op["op_name"] == "DELEGATE" for op in ops)
    outside: collections.Counter[str] = collections.Counter()
    visited: set[int] = set()
    stack = [int(d["index"]) for d in interpreter.get_output_details()]
    while stack:
        op = producer.get(stack.pop())
        if op is None or op["index"] in visited:
            continue
        visited.add(op["index"])
        if op["op_name"] != "DELEGATE":
            outside[op["op_name"]] += 1
        stack.extend(int(t) for t in op["inputs"] if t >= 0)
    return num_delegates, dict(sorted(outside.items()))


def inspect_tflite(path: str | os.PathLike) -> TFLiteReport:
    """Reads a `.tflite` file: op histogram, ranks, Flex/custom ops, I/O, XNNPACK partitions.

    The op histogram and ranks come from the flatbuffer itself; the I/O details
    and the XNNPACK partitioning from an ``ai_edge_litert`` interpreter created with
    its default delegates (those fields are ``None``/empty if the file does not load,
    e.g. because it needs Flex ops).
    """
    path = os.fspath(path)
    summary = _read_flatbuffer(path)
    histogram = summary.histogram
    flex = sorted(op for op in histogram if op.startswith("Flex"))
    custom = sorted(
        op for op in histogram if op not in BUILTIN_NAMES.values() and not op.startswith("Flex")
    )
    inputs, outputs = summary.inputs, summary.outputs
    partitions = outside_count = outside = None
    try:
        interpreter = Interpreter(model_path=path, num_threads=1)
        interpreter.allocate_tensors()
    except (RuntimeError, ValueError):
        interpreter = None
    if interpreter is not None:
        inputs = [TensorDetails.from_interpreter(d) for d in interpreter.get_input_details()]
        outputs = [TensorDetails.from_interpreter(d) for d in interpreter.get_output_details()]
        partitions, outside = _xnnpack_coverage(interpreter)
        outside_count = sum(outside.values())
    return TFLiteReport(
        path=path,
        size_bytes=os.path.getsize(path),
        op_histogram=histogram,
        max_tensor_rank=summary.max_rank,
        flex_ops=flex,
        custom_ops=custom,
        inputs=inputs,
        outputs=outputs,
        dynamic_batch=bool(inputs) and inputs[0].shape_signature[:1] == (-1,),
        num_xnnpack_partitions=partitions,
        num_ops_outside_xnnpack=outside_count,
        ops_outside_xnnpack=outside,
        float_ops=summary.float_ops,
        metadata=summary.metadata,
    )
