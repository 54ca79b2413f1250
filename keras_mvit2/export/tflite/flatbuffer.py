"""Reading and writing `.tflite` flatbuffers with LiteRT's generated schema (no TF import)."""

from __future__ import annotations

import os
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
    """The whole model as LiteRT's object API (`ModelT`), from a file or its bytes.

    Buffers stored outside the flatbuffer (``offset``/``size`` into the file, as
    ai-edge-quantizer writes its constants) are read into ``data``, so the model
    re-serializes (`serialize_flatbuffer`) on its own.
    """
    if isinstance(path_or_bytes, bytes | bytearray):
        buf = bytearray(path_or_bytes)
    else:
        with open(path_or_bytes, "rb") as f:
            buf = bytearray(f.read())
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
