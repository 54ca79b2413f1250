"""The numeric formats of `.tflite` exports, shared by both roads (no TensorFlow import)."""

from __future__ import annotations

__all__ = ["CALIBRATED", "IO_DTYPES", "QUANTIZATIONS"]

#: Conversion modes of `to_tflite` and `to_tflite_via_torch`.
QUANTIZATIONS = ("float32", "float16", "dynamic_int8", "int8", "int16x8")
#: Allowed `io_dtype` per quantization (the first is the default).
IO_DTYPES = {
    "float32": ("float32",),
    "float16": ("float32",),
    "dynamic_int8": ("float32",),
    "int8": ("float32", "int8", "uint8"),
    "int16x8": ("float32", "int16"),
}
#: Quantizations calibrated on a representative dataset.
CALIBRATED = ("int8", "int16x8")
