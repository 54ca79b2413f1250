"""The numeric formats of `.tflite` exports, each resolved once into a `TFLiteQuantization`.

A `quantization` string (``"float32"``, ``"float16"``, ``"dynamic_int8"``, ``"int8"``,
``"int16x8"``) is what users pass; `resolve_quantization` turns it, at the entry of a
conversion, into the frozen description that the converters, the targets and the optimizer
read: the converter's op set, whether it calibrates, the forms the TensorFlow road traces,
the activation range method, the I/O types it allows, the float-op checks and what the
metadata records. Shared by both roads (`to_tflite`, `to_tflite_via_torch`); no TensorFlow
import.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from keras_mvit2.layers import export_forms
from keras_mvit2.layers.export_forms import ExportForms

__all__ = [
    "CALIBRATED",
    "IO_DTYPES",
    "QUANTIZATIONS",
    "TFLITE_QUANTIZATIONS",
    "TFLiteQuantization",
    "resolve_quantization",
]

OpSet = Literal["builtins", "builtins_int8", "int16x8"]


@dataclasses.dataclass(frozen=True)
class TFLiteQuantization:
    """What one `quantization` value means for a `.tflite` conversion.

    Attributes:
        name: the user's string, also the metadata's ``quantization``.
        op_set: the converter's op set: ``"builtins"`` (``TFLITE_BUILTINS``),
            ``"builtins_int8"`` (``TFLITE_BUILTINS_INT8``: every op int8) or ``"int16x8"``
            (int16 activations and int8 weights, ops without an int16 kernel stay float
            builtins).
        optimized: whether the converter quantizes at all (``tf.lite.Optimize.DEFAULT``).
        float16_weights: whether the weights are stored in float16.
        calibrated: whether activation ranges are calibrated on representative images.
        io_dtypes: the allowed `io_dtype` values, the default first.
        forms: the forms `to_tflite` traces unless its caller passes others
            (`keras_mvit2.layers.export_forms`): full int8 takes `export_forms.INT8` (the
            GroupNorm's ``E[x^2]`` as a matrix product), the others `export_forms.KERAS`.
        activation_ranges: the default activation range method of a calibrated format
            (`keras_mvit2.export.tflite.activation_ranges`), ``None`` for the others.
        float_layers: whether `float_layers` (layers kept float in an integer model) apply.
        integer_only: whether a float op left in the file is an error (`allow_float_ops`).
        int16_activations: whether TF's int16x8 quantizer runs (its fatal hazards are
            checked on the float graph first).
        fast_int8_kernels: whether, after quantization, the file is rewritten for LiteRT's
            fast int8 kernels (`keras_mvit2.export.tflite.int8_kernels`: constant
            matrix-product operands at zero point 0, RSQRT / SQRT as table lookups).
    """

    name: str
    op_set: OpSet = "builtins"
    optimized: bool = False
    float16_weights: bool = False
    calibrated: bool = False
    io_dtypes: tuple[str, ...] = ("float32",)
    forms: ExportForms = export_forms.KERAS
    activation_ranges: str | None = None
    float_layers: bool = False
    integer_only: bool = False
    int16_activations: bool = False
    fast_int8_kernels: bool = False

    @property
    def float_weights(self) -> bool:
        """Whether weights and compute stay float (float32, float16): no integer rounding."""
        return not self.optimized or self.float16_weights

    @property
    def quantized_io(self) -> bool:
        """Whether the file may take and give quantized tensors (`io_dtypes` beyond float32)."""
        return len(self.io_dtypes) > 1


#: Every format of `to_tflite` and `to_tflite_via_torch`, by name, in `QUANTIZATIONS` order.
TFLITE_QUANTIZATIONS: dict[str, TFLiteQuantization] = {q.name: q for q in (
    TFLiteQuantization("float32"),
    TFLiteQuantization("float16", optimized=True, float16_weights=True),
    TFLiteQuantization("dynamic_int8", optimized=True),
    # int8 clips heavy tails (docs/int8.md); int16 has 256x finer steps and keeps min / max.
    TFLiteQuantization("int8", op_set="builtins_int8", optimized=True, calibrated=True,
                       io_dtypes=("float32", "int8", "uint8"), forms=export_forms.INT8,
                       activation_ranges="p99.99", float_layers=True, integer_only=True,
                       fast_int8_kernels=True),
    TFLiteQuantization("int16x8", op_set="int16x8", optimized=True, calibrated=True,
                       io_dtypes=("float32", "int16"), activation_ranges="minmax",
                       int16_activations=True),
)}

#: Conversion modes of `to_tflite` and `to_tflite_via_torch`.
QUANTIZATIONS = tuple(TFLITE_QUANTIZATIONS)
#: Allowed `io_dtype` per quantization (the first is the default).
IO_DTYPES = {name: q.io_dtypes for name, q in TFLITE_QUANTIZATIONS.items()}
#: Quantizations calibrated on a representative dataset.
CALIBRATED = tuple(name for name, q in TFLITE_QUANTIZATIONS.items() if q.calibrated)


def resolve_quantization(quantization: Any) -> TFLiteQuantization:
    """The description of `quantization` (one of `QUANTIZATIONS`), or a ValueError naming them."""
    if isinstance(quantization, TFLiteQuantization):
        return quantization
    if not isinstance(quantization, str) or quantization not in TFLITE_QUANTIZATIONS:
        raise ValueError(
            f"quantization must be one of {QUANTIZATIONS}. Received: quantization={quantization!r}"
        )
    return TFLITE_QUANTIZATIONS[quantization]
