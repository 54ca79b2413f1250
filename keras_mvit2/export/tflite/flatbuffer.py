"""Reading and writing `.tflite` flatbuffers with LiteRT's generated schema (no TF import).

Two readers: `parse_flatbuffer` gives a fresh `ModelT` for the code that edits it (and then
serializes it: `serialize_flatbuffer`); `read_flatbuffer` gives the code that only reads
(`inspect_tflite`, `read_tflite_metadata`, `tflite_macs`, the float-op check, ...) one shared
`ModelT` per content, so the same file read by several of them in a row (`to_tflite` checks,
then inspects, its file) is unpacked once: the object API unpacks in pure Python, about
0.1 s per MB.
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
from typing import Any

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema

#: Builtin operator code -> name ("CONV_2D", ...).
BUILTIN_NAMES = {
    value: name for name, value in vars(tfl_schema.BuiltinOperator).items()
    if not name.startswith("_")
}
#: Tensor type code -> lower-case name ("float32", "int8", ...).
TENSOR_TYPE_NAMES = {
    value: name.lower() for name, value in vars(tfl_schema.TensorType).items()
    if not name.startswith("_")
}
#: Tensor type code -> numpy dtype, for the types whose buffers hold plain arrays.
NUMPY_DTYPES = {
    tfl_schema.TensorType.FLOAT32: np.float32,
    tfl_schema.TensorType.FLOAT16: np.float16,
    tfl_schema.TensorType.INT32: np.int32,
    tfl_schema.TensorType.INT8: np.int8,
    tfl_schema.TensorType.UINT8: np.uint8,
}


def parse_flatbuffer(path_or_bytes: str | os.PathLike | bytes | bytearray) -> Any:
    """The whole model as LiteRT's object API (`ModelT`), from a file or its bytes: a new
    object on every call, the caller's to edit (code that only reads: `read_flatbuffer`).

    Buffers stored outside the flatbuffer (``offset``/``size`` into the file, as
    ai-edge-quantizer writes its constants) are read into ``data``, so the model
    re-serializes (`serialize_flatbuffer`) on its own.
    """
    buf = bytearray(_file_bytes(path_or_bytes))
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise ValueError(
            "Not a TFLite flatbuffer (the file identifier is not 'TFL3'); pass a .tflite file."
        )
    model = tfl_schema.ModelT.InitFromPackedBuf(buf, 0)
    for buffer in model.buffers or []:
        if buffer.offset > 1 and buffer.size and (buffer.data is None or not len(buffer.data)):
            buffer.data = np.frombuffer(buf, np.uint8, int(buffer.size), int(buffer.offset))
            buffer.offset = buffer.size = 0
    return model


#: `read_flatbuffer`'s models: SHA-256 of the content -> (content size, `ModelT`), least
#: recently used first; at most `_READ_CACHE_ENTRIES` models of `_READ_CACHE_BYTES` in all.
_READ_CACHE: collections.OrderedDict[bytes, tuple[int, Any]] = collections.OrderedDict()
_READ_CACHE_ENTRIES = 4
_READ_CACHE_BYTES = 256 << 20
_READ_CACHE_LOCK = threading.Lock()


def read_flatbuffer(path_or_bytes: str | os.PathLike | bytes | bytearray) -> Any:
    """`parse_flatbuffer` for code that only reads the model: READ-ONLY, do not mutate it.

    The `ModelT` is shared: the last few models read are kept, keyed by the SHA-256 of the
    content (not by path or time stamp), so bytes read again (the same file, a copy, the
    file after `os.replace` onto its final path) give the same object without unpacking
    them again, and a file rewritten in place is parsed anew. Code that edits the model
    (and everything it hands the model to) takes `parse_flatbuffer`'s fresh one.
    """
    data = _file_bytes(path_or_bytes)
    key = hashlib.sha256(data).digest()
    with _READ_CACHE_LOCK:
        hit = _READ_CACHE.get(key)
        if hit is not None:
            _READ_CACHE.move_to_end(key)
            return hit[1]
    model = parse_flatbuffer(data)
    size = len(data)
    if size <= _READ_CACHE_BYTES:
        with _READ_CACHE_LOCK:
            _READ_CACHE[key] = (size, model)
            _READ_CACHE.move_to_end(key)
            total = sum(entry[0] for entry in _READ_CACHE.values())
            while len(_READ_CACHE) > _READ_CACHE_ENTRIES or total > _READ_CACHE_BYTES:
                total -= _READ_CACHE.popitem(last=False)[1][0]
    return model


def _file_bytes(path_or_bytes: str | os.PathLike | bytes | bytearray) -> bytes | bytearray:
    """The bytes given, or the file's content."""
    if isinstance(path_or_bytes, bytes | bytearray):
        return path_or_bytes
    with open(path_or_bytes, "rb") as f:
        return f.read()


def op_names(model: Any) -> list[str]:
    """The name of each operator code of a `ModelT` (custom ops by their custom name)."""
    names = []
    for code in model.operatorCodes or []:
        builtin = max(int(code.builtinCode), int(code.deprecatedBuiltinCode))
        if builtin == tfl_schema.BuiltinOperator.CUSTOM:
            custom = code.customCode
            names.append(decode_name(custom))
        else:
            names.append(BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}"))
    return names


def serialize_flatbuffer(model: Any, size_hint: int = 1024) -> bytes:
    """A `ModelT` (as from `parse_flatbuffer`, possibly edited) back to `.tflite` bytes."""
    builder = flatbuffers.Builder(size_hint)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def tensor_indices(array: Any) -> list[int]:
    """An index vector of the object API (numpy array, list or None) as a list of ints.

    (The object API holds index vectors as numpy arrays: ``array or []`` would be
    wrong, a single index 0 is falsy.)
    """
    return [] if array is None else [int(i) for i in array]


def decode_name(value: Any) -> str:
    """A string field of the object API (tensor, metadata or custom-op name) as `str`."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def constant_array(model: Any, tensor: Any) -> np.ndarray | None:
    """The data of a constant `tensor` (a `TensorT` of `model`) as an array of its type and
    shape; None when the tensor has no data (not a constant) or its type is not in
    `NUMPY_DTYPES`."""
    dtype = NUMPY_DTYPES.get(int(tensor.type))
    data = model.buffers[tensor.buffer].data
    if dtype is None or data is None or len(data) == 0:
        return None
    values = np.frombuffer(np.asarray(data, dtype=np.uint8).tobytes(), dtype=dtype)
    return values.reshape(tensor_indices(tensor.shape))


def add_tensor(subgraph: Any, name: str, dtype: int, shape, buffer: int = 0,
               quantization: Any = None) -> int:
    """Appends a `TensorT` to `subgraph` and returns its index. `buffer` 0 is the empty
    buffer (an activation); `quantization` a `QuantizationParametersT` or None."""
    tensor = tfl_schema.TensorT()
    tensor.name = name
    tensor.type = dtype
    tensor.shape = np.asarray(shape, dtype=np.int32)
    tensor.buffer = buffer
    tensor.quantization = quantization
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def add_buffer(model: Any, values: np.ndarray) -> int:
    """Appends a buffer holding `values` (raw bytes in their own dtype) to `model`; its index."""
    buffer = tfl_schema.BufferT()
    buffer.data = np.frombuffer(np.ascontiguousarray(values).tobytes(), dtype=np.uint8)
    model.buffers.append(buffer)
    return len(model.buffers) - 1


def operator_code(model: Any, name: str, version: int) -> int:
    """The index of builtin operator `name`'s code in `model`, appended (at `version`) when
    the model has none yet."""
    names = op_names(model)
    if name in names:
        return names.index(name)
    code = tfl_schema.OperatorCodeT()
    builtin = getattr(tfl_schema.BuiltinOperator, name)
    code.builtinCode = builtin
    code.deprecatedBuiltinCode = min(builtin, 127)
    code.version = version
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def new_operator(opcode: int, inputs: list[int], outputs: list[int], options_type: int = 0,
                 options: Any = None) -> Any:
    """An `OperatorT` of operator code `opcode` reading `inputs` and writing `outputs`
    (tensor indices), with builtin options of type `options_type` (0: none)."""
    op = tfl_schema.OperatorT()
    op.opcodeIndex = opcode
    op.inputs = np.asarray(inputs, dtype=np.int32)
    op.outputs = np.asarray(outputs, dtype=np.int32)
    op.builtinOptionsType = options_type
    op.builtinOptions = options
    return op


def tensor_name(tensor: Any) -> str:
    """A `TensorT`'s name without the converter's ``;``-joined aliases."""
    return decode_name(tensor.name).split(";")[0]


def drop_unused(model: Any) -> None:
    """Removes tensors no op or signature uses, then buffers no tensor or metadata uses."""
    for subgraph_index, subgraph in enumerate(model.subgraphs or []):
        used = set(tensor_indices(subgraph.inputs)) | set(tensor_indices(subgraph.outputs))
        for op in subgraph.operators or []:
            for vector in (op.inputs, op.outputs, op.intermediates):
                used |= {t for t in tensor_indices(vector) if t >= 0}
        new_index = {old: new for new, old in enumerate(sorted(used))}
        subgraph.tensors = [subgraph.tensors[old] for old in sorted(used)]

        def remap(vector, mapping=new_index):
            if vector is None:
                return None
            return np.asarray([mapping[t] if t >= 0 else t for t in tensor_indices(vector)],
                              dtype=np.int32)

        subgraph.inputs = remap(subgraph.inputs)
        subgraph.outputs = remap(subgraph.outputs)
        for op in subgraph.operators or []:
            op.inputs = remap(op.inputs)
            op.outputs = remap(op.outputs)
            op.intermediates = remap(op.intermediates)
        for signature in model.signatureDefs or []:
            if signature.subgraphIndex != subgraph_index:
                continue
            for entry in (signature.inputs or []) + (signature.outputs or []):
                entry.tensorIndex = new_index[entry.tensorIndex]

    used_buffers = {0} | {
        t.buffer for subgraph in model.subgraphs or [] for t in subgraph.tensors or []
    } | {m.buffer for m in model.metadata or []} | set(tensor_indices(model.metadataBuffer))
    new_buffer = {old: new for new, old in enumerate(sorted(used_buffers))}
    model.buffers = [model.buffers[old] for old in sorted(used_buffers)]
    for subgraph in model.subgraphs or []:
        for t in subgraph.tensors or []:
            t.buffer = new_buffer[t.buffer]
    for entry in model.metadata or []:
        entry.buffer = new_buffer[entry.buffer]
    if model.metadataBuffer is not None:
        model.metadataBuffer = [new_buffer[b] for b in tensor_indices(model.metadataBuffer)]
