"""Reading `.tflite` flatbuffers with LiteRT's generated schema (no TensorFlow import)."""

from __future__ import annotations

import os
from typing import Any

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


def parse_flatbuffer(path_or_bytes: str | os.PathLike | bytes | bytearray) -> Any:
    """The whole model as LiteRT's object API (`ModelT`), from a file or its bytes."""
    if isinstance(path_or_bytes, bytes | bytearray):
        buf = bytearray(path_or_bytes)
    else:
        with open(path_or_bytes, "rb") as f:
            buf = bytearray(f.read())
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise ValueError(
            "Not a TFLite flatbuffer (the file identifier is not 'TFL3'); pass a .tflite file."
        )
    return tfl_schema.ModelT.InitFromPackedBuf(buf, 0)


def op_names(model: Any) -> list[str]:
    """The name of each operator code of a `ModelT` (custom ops by their custom name)."""
    names = []
    for code in model.operatorCodes or []:
        builtin = max(int(code.builtinCode), int(code.deprecatedBuiltinCode))
        if builtin == tfl_schema.BuiltinOperator.CUSTOM:
            custom = code.customCode
            names.append(custom.decode() if isinstance(custom, bytes) else str(custom))
        else:
            names.append(BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}"))
    return names
