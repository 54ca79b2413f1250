"""Keras 3 model -> TFLite (LiteRT) flatbuffer, builtin ops only, checked at run time.

The conversion path is the one that was measured to be correct with Keras 3.15 /
TF 2.21 (see the project's stack notes):

1. ``model.export(tmp, format="tf_saved_model", input_signature=[InputSpec(shape=...)])``
   with a fixed (or explicitly dynamic) batch;
2. ``tf.lite.TFLiteConverter.from_saved_model(tmp)`` with
   ``supported_ops = [TFLITE_BUILTINS]`` only, so an op without a builtin kernel is an
   error (`UnsupportedOpError`) instead of a silent Flex (SELECT_TF_OPS) dependency;
3. the flatbuffer is run once in ``ai_edge_litert`` before it is moved onto the
   target path (the converter does not catch run-time failures such as
   ``BROADCAST_TO ... failed to prepare``).

Not used on purpose: ``from_concrete_functions([cf], keras_model)`` (leaves the
variables unfrozen and gives NaN) and ``model.export(format="litert")`` (enables
Flex ops by default).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import tempfile
from typing import Any, NamedTuple

import keras
import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema
from ai_edge_litert.interpreter import Interpreter

from keras_mvit2.utils.files import atomic_output

__all__ = [
    "TFLiteReport",
    "TensorDetails",
    "UnsupportedOpError",
    "inspect_tflite",
    "run_tflite",
    "to_tflite",
]

#: Ops that mean the model still holds un-frozen variables (broken conversion).
_VARIABLE_OPS = ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE")

_OPS_COMPATIBILITY_URL = "https://ai.google.dev/edge/litert/models/ops_compatibility"

_BUILTIN_NAMES = {
    value: name for name, value in vars(tfl_schema.BuiltinOperator).items()
    if not name.startswith("_")
}
_TENSOR_TYPE_NAMES = {
    value: name.lower() for name, value in vars(tfl_schema.TensorType).items()
    if not name.startswith("_")
}


class UnsupportedOpError(RuntimeError):
    """The model needs TensorFlow ops that have no TFLite builtin kernel.

    keras_mvit2 converts with ``TFLITE_BUILTINS`` only; such ops would need the
    Flex delegate (SELECT_TF_OPS) or a custom kernel, which mobile runtimes
    usually do not ship.

    Attributes:
        ops: the TensorFlow op names (e.g. ``["Cumprod"]``), sorted.
        layers: the Keras layers that contain them, as ``"outer/inner"`` paths of
            layer names (empty where the converter gave no usable location).
    """

    def __init__(self, message: str, ops: list[str], layers: list[str]):
        super().__init__(message)
        self.ops = ops
        self.layers = layers


@dataclasses.dataclass(frozen=True)
class TensorDetails:
    """One input or output of a TFLite model.

    Attributes:
        name: tensor name in the flatbuffer.
        shape: shape the interpreter allocates by default (a dynamic batch shows as 1).
        shape_signature: shape with ``-1`` for dynamic dimensions.
        dtype: numpy dtype name, e.g. ``"float32"`` or ``"int8"``.
        quantization: ``(scale, zero_point)``; ``(0.0, 0)`` for float tensors.
    """

    name: str
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...]
    dtype: str
    quantization: tuple[float, int]

    @classmethod
    def from_interpreter(cls, details: dict[str, Any]) -> TensorDetails:
        signature = details.get("shape_signature", details["shape"])
        scale, zero_point = details["quantization"]
        return cls(
            name=details["name"],
            shape=tuple(int(d) for d in details["shape"]),
            shape_signature=tuple(int(d) for d in signature),
            dtype=np.dtype(details["dtype"]).name,
            quantization=(float(scale), int(zero_point)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "shape_signature": list(self.shape_signature),
            "dtype": self.dtype,
            "quantization": {"scale": self.quantization[0], "zero_point": self.quantization[1]},
        }


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

    @property
    def num_ops(self) -> int:
        """Total number of ops in the file."""
        return sum(self.op_histogram.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict of the report."""
        out = dataclasses.asdict(self)
        out["inputs"] = [t.to_dict() for t in self.inputs]
        out["outputs"] = [t.to_dict() for t in self.outputs]
        out["num_ops"] = self.num_ops
        return out


# --------------------------------------------------------------------------------------
# Conversion


def to_tflite(
    model: keras.Model, path: str | os.PathLike, *, batch_size: int | None = 1
) -> TFLiteReport:
    """Converts a Keras 3 model to a float32 TFLite file with builtin ops only.

    The model is exported to a temporary SavedModel (always removed), converted
    with ``TFLiteConverter.from_saved_model`` and ``supported_ops=[TFLITE_BUILTINS]``,
    run once in ``ai_edge_litert`` and only then moved onto `path` (atomically: on any
    error an existing file at `path` is left as it was and nothing new is written).

    Args:
        model: a built Keras model with one input of static shape
            ``(batch, height, width, channels)`` (any rank works as long as all
            non-batch dimensions are static).
        path: the `.tflite` file to write.
        batch_size: the fixed batch of the exported graph (default 1, the mobile
            case, with the fewest ops). ``None`` exports a dynamic batch; the file is
            then run with batches 2 and 1 and an error is raised if it does not
            run (some graphs, e.g. tf_keras GroupNormalization, fail with a dynamic batch).

    Returns:
        The `TFLiteReport` of the written file.

    Raises:
        UnsupportedOpError: an op has no TFLite builtin; the message names the
            TensorFlow op(s), the Keras layer(s) that contain them and the fix.
        RuntimeError: the converted model fails to run in ``ai_edge_litert``, gives
            non-finite outputs, or still holds variables.
        ValueError: invalid `model` input shape or `batch_size`.
    """
    input_shape = _export_input_shape(model, batch_size)
    path = os.fspath(path)
    with tempfile.TemporaryDirectory(prefix="keras_mvit2_tflite_") as tmp_dir:
        saved_model_dir = os.path.join(tmp_dir, "saved_model")
        model.export(
            saved_model_dir,
            format="tf_saved_model",
            input_signature=[keras.InputSpec(shape=input_shape, dtype=model.inputs[0].dtype)],
            verbose=False,
        )
        flatbuffer = _convert_saved_model(saved_model_dir, model)

    with atomic_output(path) as tmp_path:
        with open(tmp_path, "wb") as f:
            f.write(flatbuffer)
        _check_runs(tmp_path, dynamic_batch=batch_size is None)
    return inspect_tflite(path)


def _export_input_shape(model: keras.Model, batch_size: int | None) -> tuple[int | None, ...]:
    if batch_size is not None and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
    ):
        raise ValueError(
            f"batch_size must be a positive int or None. Received: batch_size={batch_size!r}"
        )
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ValueError(
            "to_tflite needs a model with a defined input (Functional, or Sequential starting "
            f"with keras.Input). Received: model={model.name!r} without inputs"
        )
    if len(inputs) != 1:
        raise ValueError(
            f"to_tflite supports models with one input. Received: {len(inputs)} inputs"
        )
    shape = tuple(inputs[0].shape)
    if any(d is None for d in shape[1:]):
        raise ValueError(
            "to_tflite needs a static input shape apart from the batch (build the model with a "
            f"fixed input_shape, e.g. (256, 256, 3)). Received: input shape={shape}"
        )
    return (batch_size, *shape[1:])


def _make_converter(saved_model_dir: str):
    """The converter for a float32, builtin-only model (quantization settings go here)."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter


def _convert_saved_model(saved_model_dir: str, model: keras.Model) -> bytes:
    from tensorflow.lite.python.convert_phase import ConverterError

    converter = _make_converter(saved_model_dir)
    try:
        return converter.convert()
    except ConverterError as err:
        unsupported = _unsupported_ops_from_error(err)
        if not unsupported:
            raise
        raise _unsupported_op_error(unsupported, model) from err


# Error-text patterns of the TF 2.21 MLIR converter.
_RE_SELECT_OPS = re.compile(r"TF Select ops: ([^\n]+)")
_RE_NOT_BUILTIN = re.compile(r"'tf\.(\w+)' op is neither a custom op nor a flex op")
_RE_CUSTOM_SECTION = re.compile(
    r"Ops that need custom implementation[^\n]*:\s*\n((?:\s*tf\.\w+[^\n]*\n?)+)"
)
_RE_LOC = re.compile(r'fused\["(\w+):", "([^"@]+)@')


def _unsupported_ops_from_error(err: Exception) -> dict[str, set[str]]:
    """TF op name -> set of name-scope paths where the converter found it.

    Reads the structured `errors` of a `ConverterError` (operator name and call-site
    location) and falls back on the error text.
    """
    found: dict[str, set[str]] = {}
    for data in getattr(err, "errors", None) or []:
        code = _enum_name(data, "error_code")
        if code not in ("ERROR_NEEDS_FLEX_OPS", "ERROR_NEEDS_CUSTOM_OPS"):
            continue
        op = data.operator.name.removeprefix("tf.")
        if not op:
            continue
        found.setdefault(op, set())
        calls = list(data.location.call)
        if calls:
            scope = calls[0].name.split("@", 1)[0]
            found[op].add(scope)
        elif data.location.name:
            found[op].add(data.location.name.split("@", 1)[0])

    text = str(err)
    for match in _RE_SELECT_OPS.finditer(text):
        for op in match.group(1).split(","):
            if op.strip():
                found.setdefault(op.strip().removeprefix("tf."), set())
    for match in _RE_CUSTOM_SECTION.finditer(text):
        for op in re.findall(r"tf\.(\w+)", match.group(1)):
            found.setdefault(op, set())
    for line in text.splitlines():
        op_match = _RE_NOT_BUILTIN.search(line)
        if not op_match:
            continue
        op = op_match.group(1)
        found.setdefault(op, set())
        for loc_op, scope in _RE_LOC.findall(line):
            if loc_op == op:
                found[op].add(scope)
    return dict(found)


def _enum_name(message, field: str) -> str:
    value = getattr(message, field, None)
    try:
        return message.DESCRIPTOR.fields_by_name[field].enum_type.values_by_number[value].name
    except (AttributeError, KeyError):
        return str(value)


def _unsupported_op_error(
    unsupported: dict[str, set[str]], model: keras.Model
) -> UnsupportedOpError:
    known = _layer_names(model)
    lines = []
    all_layers: list[str] = []
    for op in sorted(unsupported):
        paths = (_layer_path(scope, known, model.name) for scope in unsupported[op])
        layers = sorted({p for p in paths if p})
        all_layers.extend(p for p in layers if p not in all_layers)
        if layers:
            where = ", ".join(f"'{p}' ({known[p.rsplit('/', 1)[-1]]})" for p in layers)
            lines.append(f"  - tf.{op} in layer {where}")
        else:
            lines.append(f"  - tf.{op} (layer unknown)")
    ops = sorted(unsupported)
    message = (
        f"Model {model.name!r} needs TensorFlow op(s) with no TFLite builtin kernel: "
        f"{', '.join(ops)}. keras_mvit2 converts with TFLITE_BUILTINS only (no Flex / "
        "SELECT_TF_OPS delegate, which mobile runtimes usually lack).\n"
        + "\n".join(lines)
        + "\nFix: rewrite that computation in the layer with ops that have TFLite builtins "
        f"(see {_OPS_COMPATIBILITY_URL}); if the layer is part of keras_mvit2, please report "
        "it as a bug with this message."
    )
    return UnsupportedOpError(message, ops, all_layers)


def _layer_names(model: keras.Model) -> dict[str, str]:
    """Layer name -> class name, for the model and every nested layer."""
    names: dict[str, str] = {}
    stack = [model]
    seen: set[int] = set()
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        names.setdefault(layer.name, type(layer).__name__)
        flatten = getattr(layer, "_flatten_layers", None)
        children = (
            list(flatten(include_self=False, recursive=False))
            if flatten else list(getattr(layer, "layers", []))
        )
        stack.extend(children)
    return names


def _layer_path(scope: str, known: dict[str, str], model_name: str) -> str:
    """``"functional_1/stage2_block1_1/transformer_0_1/Op"`` -> ``"stage2_block1/transformer_0"``.

    Each name scope is matched against the model's layer names; the ``_<n>``
    suffixes that TF adds to make scopes unique are stripped (first one first,
    as the export trace scopes every layer once more).
    """
    parts = scope.split("/")[:-1]   # the last part is the op name
    path = []
    for part in parts:
        name = _match_layer_name(part, known)
        if name is None:
            continue
        if not path and name == model_name:
            continue
        path.append(name)
    return "/".join(path)


def _match_layer_name(part: str, known: dict[str, str]) -> str | None:
    candidates = []
    stripped = re.sub(r"_\d+$", "", part)
    if stripped != part:
        candidates.append(stripped)
    candidates.append(part)
    while True:
        shorter = re.sub(r"_\d+$", "", candidates[-1])
        if shorter == candidates[-1]:
            break
        candidates.append(shorter)
    return next((c for c in candidates if c in known), None)


# --------------------------------------------------------------------------------------
# Run-time check, inspection, execution


def _check_runs(path: str, *, dynamic_batch: bool) -> None:
    """Runs the file once (batches 2 then 1 for a dynamic batch) or raises RuntimeError."""
    histogram = _read_flatbuffer(path).histogram
    variables = sorted(set(histogram) & set(_VARIABLE_OPS))
    if variables:
        raise RuntimeError(
            f"The converted model still holds variables ({', '.join(variables)}): the weights "
            "were not frozen and the model would compute garbage. This is a converter-path "
            "bug in keras_mvit2; please report it."
        )
    interpreter = Interpreter(model_path=path)
    details = interpreter.get_input_details()
    rng = np.random.default_rng(0)
    if not dynamic_batch:
        feeds = [_sample_input(rng, [int(d) for d in t["shape"]], t) for t in details]
        _invoke_checked(interpreter, feeds, resize=False, what="once")
        return
    # Dynamic batch: batch 2, then the first sample alone must give the same result.
    feeds = []
    for t in details:
        shape = [int(d) for d in t["shape_signature"]]
        shape = [2, *(1 if d < 0 else d for d in shape[1:])]
        feeds.append(_sample_input(rng, shape, t))
    out2 = _invoke_checked(interpreter, feeds, resize=True, what="with batch 2")
    out1 = _invoke_checked(interpreter, [f[:1] for f in feeds], resize=True, what="with batch 1")
    for a, b in zip(out1, out2, strict=True):
        ref = b[:1].astype("float64")
        scale = max(1.0, float(np.abs(ref).max()))
        if a.shape != ref.shape or not np.allclose(a, ref, rtol=0.0, atol=1e-3 * scale):
            raise RuntimeError(
                "The dynamic-batch TFLite model gives different results for the same sample in "
                "batches of 1 and 2; convert with a fixed batch (batch_size=1) instead."
            )


def _invoke_checked(
    interpreter: Interpreter, feeds: list[np.ndarray], *, resize: bool, what: str
) -> list[np.ndarray]:
    details = interpreter.get_input_details()
    try:
        if resize:
            for t, feed in zip(details, feeds, strict=True):
                interpreter.resize_tensor_input(t["index"], list(feed.shape), strict=True)
        interpreter.allocate_tensors()
        for t, feed in zip(details, feeds, strict=True):
            interpreter.set_tensor(t["index"], feed)
        interpreter.invoke()
        outputs = [
            interpreter.get_tensor(t["index"]).copy() for t in interpreter.get_output_details()
        ]
    except (RuntimeError, ValueError) as err:
        hint = (
            " The dynamic-batch graph does not run; convert with a fixed batch "
            "(to_tflite(..., batch_size=1)) instead." if resize else ""
        )
        raise RuntimeError(
            f"The converted TFLite model failed to run {what} in ai_edge_litert: {err}{hint}"
        ) from err
    for out in outputs:
        if np.issubdtype(out.dtype, np.floating) and not np.all(np.isfinite(out)):
            raise RuntimeError(
                f"The converted TFLite model gives non-finite outputs (NaN/inf) when run {what} "
                "on inputs in [0, 1); not writing it."
            )
    return outputs


def _sample_input(rng: np.random.Generator, shape: list[int], detail: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    x = rng.random(shape, dtype=np.float32)
    if np.issubdtype(dtype, np.floating):
        return x.astype(dtype)
    return _quantize(x, detail)


class _FlatbufferSummary(NamedTuple):
    histogram: dict[str, int]
    max_rank: int
    inputs: list[TensorDetails]
    outputs: list[TensorDetails]


def _read_flatbuffer(path: str) -> _FlatbufferSummary:
    """Op histogram (all subgraphs), max tensor rank and main-graph I/O, from the file itself."""
    with open(path, "rb") as f:
        buf = f.read()
    model = tfl_schema.ModelT.InitFromPackedBuf(bytearray(buf), 0)
    names = []
    for code in model.operatorCodes or []:
        builtin = max(int(code.builtinCode), int(code.deprecatedBuiltinCode))
        if builtin == tfl_schema.BuiltinOperator.CUSTOM:
            custom = code.customCode
            names.append(custom.decode() if isinstance(custom, bytes) else str(custom))
        else:
            names.append(_BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}"))
    counts: collections.Counter[str] = collections.Counter()
    max_rank = 0
    for subgraph in model.subgraphs or []:
        for op in subgraph.operators or []:
            counts[names[op.opcodeIndex]] += 1
        for tensor in subgraph.tensors or []:
            shape = tensor.shapeSignature if tensor.shapeSignature is not None else tensor.shape
            max_rank = max(max_rank, 0 if shape is None else len(shape))
    inputs: list[TensorDetails] = []
    outputs: list[TensorDetails] = []
    if model.subgraphs:
        main = model.subgraphs[0]
        # (index arrays are numpy arrays: no `or []`, a single index 0 is falsy)
        in_ids = [] if main.inputs is None else [int(i) for i in main.inputs]
        out_ids = [] if main.outputs is None else [int(i) for i in main.outputs]
        inputs = [_flatbuffer_tensor(main.tensors[i]) for i in in_ids]
        outputs = [_flatbuffer_tensor(main.tensors[i]) for i in out_ids]
    return _FlatbufferSummary(dict(sorted(counts.items())), max_rank, inputs, outputs)


def _flatbuffer_tensor(tensor) -> TensorDetails:
    shape = tuple(int(d) for d in (tensor.shape if tensor.shape is not None else ()))
    signature = tensor.shapeSignature
    signature = shape if signature is None else tuple(int(d) for d in signature)
    q = tensor.quantization
    scales = [] if q is None or q.scale is None else list(q.scale)
    zeros = [] if q is None or q.zeroPoint is None else list(q.zeroPoint)
    scale = float(scales[0]) if scales else 0.0
    zero = int(zeros[0]) if zeros else 0
    name = tensor.name.decode() if isinstance(tensor.name, bytes) else str(tensor.name)
    return TensorDetails(
        name=name,
        shape=shape,
        shape_signature=signature,
        dtype=_TENSOR_TYPE_NAMES.get(int(tensor.type), f"type_{tensor.type}"),
        quantization=(scale, zero),
    )


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
        op for op in histogram if op not in _BUILTIN_NAMES.values() and not op.startswith("Flex")
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
    )


def run_tflite(path: str | os.PathLike, inputs: np.ndarray, *, num_threads: int = 1) -> np.ndarray:
    """Runs a batch through a single-input, single-output TFLite model.

    A dynamic-batch model gets its input resized to the whole batch; a
    fixed-batch model (batch 1 by default) is run chunk by chunk. Quantized
    (int8/uint8) inputs and outputs are (de)quantized with the tensor's scale and
    zero point.

    Args:
        path: the `.tflite` file.
        inputs: array of shape ``(batch, *input_shape[1:])``.
        num_threads: interpreter threads.

    Returns:
        The outputs, float32, shape ``(batch, *output_shape[1:])``.
    """
    interpreter = Interpreter(model_path=os.fspath(path), num_threads=num_threads)
    input_details = interpreter.get_input_details()
    output_details = interpreter.get_output_details()
    if len(input_details) != 1 or len(output_details) != 1:
        raise ValueError(
            "run_tflite supports models with one input and one output. Received: "
            f"{len(input_details)} inputs, {len(output_details)} outputs"
        )
    in_detail = input_details[0]
    signature = [int(d) for d in in_detail["shape_signature"]]
    x = np.asarray(inputs)
    if x.ndim != len(signature) or any(
        s >= 0 and s != d for s, d in zip(signature[1:], x.shape[1:], strict=True)
    ):
        raise ValueError(
            f"inputs must have shape (batch, {', '.join(map(str, signature[1:]))}). "
            f"Received: shape={x.shape}"
        )
    if signature[0] < 0 or any(s < 0 for s in signature[1:]):
        interpreter.resize_tensor_input(in_detail["index"], list(x.shape), strict=True)
        chunk = x.shape[0]
    else:
        chunk = signature[0]
        if x.shape[0] % chunk:
            raise ValueError(
                f"The model has a fixed batch of {chunk}; the number of inputs must be a "
                f"multiple of it. Received: batch={x.shape[0]}"
            )
    interpreter.allocate_tensors()
    in_detail = interpreter.get_input_details()[0]
    out_detail = interpreter.get_output_details()[0]
    results = []
    for start in range(0, x.shape[0], chunk):
        feed = x[start : start + chunk]
        dtype = np.dtype(in_detail["dtype"])
        if np.issubdtype(dtype, np.floating):
            feed = feed.astype(dtype)
        else:
            feed = _quantize(feed.astype("float32"), in_detail)
        interpreter.set_tensor(in_detail["index"], np.ascontiguousarray(feed))
        interpreter.invoke()
        results.append(_dequantize(interpreter.get_tensor(out_detail["index"]), out_detail))
    return np.concatenate(results, axis=0)


def _quantize(x: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    scale, zero_point = detail["quantization"]
    if not scale:
        return x.astype(dtype)
    info = np.iinfo(dtype)
    q = np.round(x / scale + zero_point)
    return np.clip(q, info.min, info.max).astype(dtype)


def _dequantize(y: np.ndarray, detail: dict[str, Any]) -> np.ndarray:
    scale, zero_point = detail["quantization"]
    if np.issubdtype(y.dtype, np.integer) and scale:
        return ((y.astype("float32") - zero_point) * scale).astype("float32")
    return y.astype("float32")
