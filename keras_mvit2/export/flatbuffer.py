"""Deprecated module path, kept so that old imports work: the code moved to
`keras_mvit2.export.tflite.flatbuffer`, whose public names this module re-exports.
"""

import warnings

from keras_mvit2.export.tflite.flatbuffer import (
    BUILTIN_NAMES,
    NUMPY_DTYPES,
    TENSOR_TYPE_NAMES,
    constant_array,
    decode_name,
    op_names,
    parse_flatbuffer,
    serialize_flatbuffer,
    tensor_indices,
)

__all__ = [
    "BUILTIN_NAMES",
    "NUMPY_DTYPES",
    "TENSOR_TYPE_NAMES",
    "constant_array",
    "decode_name",
    "op_names",
    "parse_flatbuffer",
    "serialize_flatbuffer",
    "tensor_indices",
]

warnings.warn(
    "keras_mvit2.export.flatbuffer moved to "
    "keras_mvit2.export.tflite.flatbuffer; import it from there (the old path "
    "will be removed).",
    DeprecationWarning,
    stacklevel=2,
)
