"""Per-op time of a TFLite model (`op_profile`): each operator cut out of the flatbuffer
into a one-op model, fed the real intermediate values and timed on its own."""

from __future__ import annotations

import collections
import copy
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema
from ai_edge_litert.interpreter import Interpreter

from keras_mvit2.export.tflite.flatbuffer import op_names, parse_flatbuffer, serialize_flatbuffer
from keras_mvit2.latency.litert_timing import (
    _set_inputs,
    _time_invokes,
    make_interpreter,
    measure_interleaved,
    random_inputs,
)
from keras_mvit2.latency.tflite_facts import _op_macs, _shape


@dataclasses.dataclass
class OpTiming:
    """Time of one operator of a model, run on its own (see `op_profile`).

    Attributes:
        index: operator index in the main subgraph.
        op: op name, e.g. ``"CONV_2D"``.
        ms: median time of the isolated op minus the empty-model invoke overhead.
        macs: the op's MACs (0 for element-wise ops).
        output_shape: shape of its first output.
    """

    index: int
    op: str
    ms: float
    macs: int
    output_shape: list[int]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _is_constant(model: Any, tensor: Any) -> bool:
    buffer = model.buffers[tensor.buffer] if 0 < tensor.buffer < len(model.buffers) else None
    return buffer is not None and buffer.data is not None and len(buffer.data) > 0


def _single_op_model(model: Any, op: Any) -> bytes:
    """A flatbuffer holding only `op`, its tensors and its constant buffers."""
    graph = model.subgraphs[0]
    old_ids = [int(i) for i in op.inputs if int(i) >= 0] + [int(i) for i in op.outputs]
    mapping: dict[int, int] = {}
    tensors, buffers = [], [tfl_schema.BufferT()]
    for old in old_ids:
        if old in mapping:
            continue
        tensor = copy.copy(graph.tensors[old])
        if _is_constant(model, tensor):
            buffers.append(model.buffers[tensor.buffer])
            tensor.buffer = len(buffers) - 1
        else:
            tensor.buffer = 0
        mapping[old] = len(tensors)
        tensors.append(tensor)
    new_op = copy.copy(op)
    new_op.opcodeIndex = 0
    new_op.inputs = [mapping[int(i)] if int(i) >= 0 else -1 for i in op.inputs]
    new_op.outputs = [mapping[int(i)] for i in op.outputs]
    new_op.intermediates = None
    sub = tfl_schema.SubGraphT()
    sub.tensors = tensors
    sub.operators = [new_op]
    sub.inputs = [mapping[int(i)] for i in op.inputs
                  if int(i) >= 0 and not _is_constant(model, graph.tensors[int(i)])]
    sub.outputs = list(new_op.outputs)
    sub.name = "op"
    single = tfl_schema.ModelT()
    single.version = model.version
    single.operatorCodes = [model.operatorCodes[op.opcodeIndex]]
    single.subgraphs = [sub]
    single.buffers = buffers
    single.description = "keras_mvit2 op_profile"
    return serialize_flatbuffer(single)


def _overhead_model() -> bytes:
    """A one-op model doing almost nothing (RESHAPE of one float): the invoke overhead."""
    model = tfl_schema.ModelT()
    model.version = 3
    code = tfl_schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = tfl_schema.BuiltinOperator.RESHAPE
    model.operatorCodes = [code]
    shape_buffer = tfl_schema.BufferT()
    shape_buffer.data = np.array([1], dtype=np.int32).view(np.uint8)
    model.buffers = [tfl_schema.BufferT(), shape_buffer]
    tensors = []
    for name, shape, kind, buffer in (("x", [1, 1], tfl_schema.TensorType.FLOAT32, 0),
                                      ("shape", [1], tfl_schema.TensorType.INT32, 1),
                                      ("y", [1], tfl_schema.TensorType.FLOAT32, 0)):
        t = tfl_schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name, shape, kind, buffer
        tensors.append(t)
    op = tfl_schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0, 1], [2]
    sub = tfl_schema.SubGraphT()
    sub.tensors, sub.operators, sub.inputs, sub.outputs = tensors, [op], [0], [2]
    model.subgraphs = [sub]
    return serialize_flatbuffer(model, 256)


def op_profile(
    path: str | os.PathLike,
    *,
    threads: int = 1,
    xnnpack: bool = True,
    runs: int = 20,
    rounds: int = 3,
    warmup: int = 2,
    seed: int = 0,
) -> tuple[list[OpTiming], dict[str, Any]]:
    """Per-operator times of a TFLite model, each operator timed on its own.

    LiteRT's Python API exposes no op profiler, so: the model is run once with all
    intermediate tensors kept (plain kernels, exact values); then every operator of
    the main subgraph is cut into a one-op flatbuffer (`_single_op_model`) fed those
    values, and timed with the same threads and delegate, interleaved over
    `rounds` (with 1 thread the invoking thread's CPU time, robust on a loaded
    machine; else wall clock). The median invoke time of an empty one-op model is
    subtracted.

    Caveats: XNNPACK plans a whole partition at once and may elide copies
    (e.g. a RESHAPE costs nothing inside a partition but copies in isolation);
    the sum of the op times is returned next to the whole-model median
    (``info["sum_ms"]``, ``info["model_ms"]``) so the gap is visible.

    Returns:
        ``(timings, info)``: one `OpTiming` per operator, and a dict with
        ``overhead_ms``, ``sum_ms``, ``model_ms`` and ``method``.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        content = f.read()
    model = parse_flatbuffer(content)
    if len(model.subgraphs or []) != 1:
        raise ValueError(
            f"op_profile handles single-subgraph models; {path!r} has "
            f"{len(model.subgraphs or [])} subgraphs (control flow)."
        )
    names = op_names(model)
    graph = model.subgraphs[0]

    full = Interpreter(model_content=content, num_threads=threads,
                       experimental_preserve_all_tensors=True)
    full.allocate_tensors()
    _set_inputs(full, random_inputs(full, seed))
    full.invoke()

    singles: dict[int, Interpreter] = {}
    for index, op in enumerate(graph.operators or []):
        interpreter = make_interpreter(_single_op_model(model, op), threads=threads,
                                       xnnpack=xnnpack)
        feeds = []
        for i in op.inputs:
            if int(i) >= 0 and not _is_constant(model, graph.tensors[int(i)]):
                feeds.append(np.array(full.get_tensor(int(i))))
        _set_inputs(interpreter, feeds)
        singles[index] = interpreter
    singles[-1] = make_interpreter(_overhead_model(), threads=threads, xnnpack=xnnpack)
    _set_inputs(singles[-1], [np.zeros((1, 1), np.float32)])
    for interpreter in singles.values():
        _time_invokes(interpreter, warmup)
    samples: dict[int, list[float]] = collections.defaultdict(list)
    for _ in range(rounds):
        for index, interpreter in singles.items():
            timed = _time_invokes(interpreter, runs)
            samples[index].extend(timed.cpu_ms if threads == 1 else timed.wall_ms)
    overhead = float(np.median(samples.pop(-1)))
    timings = []
    for index, op in enumerate(graph.operators or []):
        name = names[op.opcodeIndex]
        timings.append(OpTiming(
            index=index,
            op=name,
            ms=max(0.0, float(np.median(samples[index])) - overhead),
            macs=_op_macs(name, op, graph.tensors),
            output_shape=_shape(graph.tensors[int(op.outputs[0])]),
        ))
    whole = make_interpreter(content, threads=threads, xnnpack=xnnpack)
    timed = measure_interleaved({0: whole}, runs=runs * rounds, warmup=warmup, rounds=1,
                                seed=seed)[0]
    model_ms = float(np.median(timed.cpu_ms if threads == 1 else timed.wall_ms))
    info = {
        "overhead_ms": overhead,
        "sum_ms": float(sum(t.ms for t in timings)),
        "model_ms": model_ms,
        "threads": threads,
        "delegate": "xnnpack" if xnnpack else "none",
        "clock": "thread CPU time" if threads == 1 else "wall clock",
        "method": "each op cut into a one-op model fed the real intermediate values, median "
                  "of isolated invokes minus the empty-model overhead",
    }
    return timings, info


def op_type_breakdown(timings: Sequence[OpTiming]) -> list[dict[str, Any]]:
    """Per op type: count, total ms, share of the summed time, MACs; slowest first."""
    total = sum(t.ms for t in timings) or 1.0
    all_macs = sum(t.macs for t in timings) or 1
    groups: dict[str, dict[str, Any]] = {}
    for t in timings:
        g = groups.setdefault(t.op, {"op": t.op, "count": 0, "ms": 0.0, "macs": 0})
        g["count"] += 1
        g["ms"] += t.ms
        g["macs"] += t.macs
    rows = sorted(groups.values(), key=lambda g: -g["ms"])
    for g in rows:
        g["share"] = g["ms"] / total
        g["macs_share"] = g["macs"] / all_macs
    return rows
