"""Which form of the MobileViTv2 transformer math each target traces: chosen here, only here.

The math (`keras_mvit2.layers.functional`) is written once. A few of its steps have two
forms that compute the same function but convert to different programs; an exporter
picks one by entering a context below (`use_forms`, `elementwise_token_pooling`) or by
passing a preset (`COREML_CHANNELS_FIRST`). The Keras layers read `current()`.

| option: form              | picked by                    | why                                |
|---------------------------|------------------------------|------------------------------------|
| pooling `"matmul"`        | default: Keras, TFLite, twin | int8: BATCH_MATMUL, int32 sums (1) |
| pooling `"product_mean"`  | Core ML, layers as traced    | float: a matmul only adds ops      |
| pooling `"product_sum"`   | Core ML blocks (2)           | one sum over the last axis         |
| normaliser `"exp_mean"`   | default                      | no TRANSPOSE; int16, int8 safe (3) |
| normaliser `"softmax"`    | Core ML blocks (2)           | one `softmax` op, last axis        |
| variance `"one_pass"`     | default                      | 2 full-tensor ops, not 5 (4)       |
| variance `"one_pass_matmul"` | full int8, QAT twin (6)   | int8: `E[x^2]` summed in int32 (5) |
| variance `"centred"`      | Core ML blocks (2)           | no cancellation in fp16            |
| unfold `"space_to_depth"` | default                      | no TRANSPOSE channels-last         |
| unfold `"depthwise_conv"` | Core ML blocks (2)           | no transpose channels-first        |

(1) The element-wise product `e * x` is requantized to 8 bits before the sum and, at
hundreds of tokens, most terms round to zero (`elementwise_token_pooling` picks
`"product_mean"` for float runtimes: the matmul adds 9 matmul and 27 reshape ops to
MobileViTV2-0.5). (2) `MobileViTV2Block`s in `coreml_layout`, with
`keras_mvit2.layers.functional.CHANNELS_FIRST`. (3) `exp(q - max)` is pooled and the pooled
tokens divided once by `mean_N(N * e)`: TFLite's SOFTMAX is last-axis only, LiteRT's int16
SUM is wrong (MEAN is not), and int8 divides by a value >= 1 instead of rounding `1 / N`
scores per token. (4) The affine folded into one scale and shift; `x * x`, not SQUARE (SQUARE stays
float in int8 TFLite). The centred form's `E[(x - E[x])^2]` has no `E[x^2] - E[x]^2`
cancellation, which matters in Core ML's fp16. (5) `E[x^2]` as one BATCH_MATMUL per sample
(the flattened tensor times itself), not MEAN of `x * x`: in full int8 `x * x` is rounded to
8 bits per element, and with heavy tails most squares round to zero (docs/int8.md, "The
GroupNorm's squares"). (6) `int8_forms`: `to_tflite(quantization="int8")` and the QAT
twin's worker; float graphs keep `"one_pass"` (one MEAN where the matrix product takes a
BATCH_MATMUL and two RESHAPEs).

Presets: `KERAS` (the default, everything the first row), `INT8` (`KERAS` with the
`"one_pass_matmul"` variance), `COREML_CHANNELS_LAST`
(`KERAS` with `"product_mean"` pooling) and `COREML_CHANNELS_FIRST` (the Core ML block trace
with `keras_mvit2.layers.functional.CHANNELS_FIRST`).

The other context switch here, `export_call`, redirects every `MobileViTV2Block` inference
call to an exporter's function (Core ML: `keras_mvit2.export.coreml.layout`).

This module imports neither Keras nor TensorFlow (the tf_keras twin imports it too).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Literal

__all__ = [
    "COREML_CHANNELS_FIRST",
    "COREML_CHANNELS_LAST",
    "INT8",
    "KERAS",
    "ExportForms",
    "block_call_override",
    "chosen",
    "current",
    "elementwise_token_pooling",
    "export_call",
    "int8_forms",
    "use_forms",
]

TokenPooling = Literal["matmul", "product_mean", "product_sum"]
TokenNormaliser = Literal["exp_mean", "softmax"]
Variance = Literal["one_pass", "one_pass_matmul", "centred"]
UnfoldForm = Literal["space_to_depth", "depthwise_conv"]


@dataclasses.dataclass(frozen=True)
class ExportForms:
    """One choice per option of the shared math (see the module docstring's table)."""

    token_pooling: TokenPooling = "matmul"
    token_normaliser: TokenNormaliser = "exp_mean"
    variance: Variance = "one_pass"
    unfold: UnfoldForm = "space_to_depth"

    def __post_init__(self) -> None:
        allowed = {
            "token_pooling": ("matmul", "product_mean", "product_sum"),
            "token_normaliser": ("exp_mean", "softmax"),
            "variance": ("one_pass", "one_pass_matmul", "centred"),
            "unfold": ("space_to_depth", "depthwise_conv"),
        }
        for field, values in allowed.items():
            if getattr(self, field) not in values:
                raise ValueError(
                    f"ExportForms.{field} must be one of {values}. "
                    f"Received: {field}={getattr(self, field)!r}"
                )


#: Keras training and inference, every TFLite format, the QAT twin.
KERAS = ExportForms()
#: Full-int8 TFLite and the QAT twin (`int8_forms`): `KERAS` with the GroupNorm's `E[x^2]`
#: as a matrix product, summed in int32 (5).
INT8 = dataclasses.replace(KERAS, variance="one_pass_matmul")
#: Core ML, layers traced as they are (channels-last): a float runtime, no matrix product.
COREML_CHANNELS_LAST = dataclasses.replace(KERAS, token_pooling="product_mean")
#: Core ML, the `MobileViTV2Block` transformer traced channels-first (`coreml_layout`).
COREML_CHANNELS_FIRST = ExportForms(
    token_pooling="product_sum", token_normaliser="softmax", variance="centred",
    unfold="depthwise_conv",
)

_FORMS: contextvars.ContextVar[ExportForms] = contextvars.ContextVar(
    "keras_mvit2_export_forms", default=KERAS
)
_EXPORT_CALL: contextvars.ContextVar[Callable | None] = contextvars.ContextVar(
    "mobilevitv2_block_export_call", default=None
)


def current() -> ExportForms:
    """The forms the layers trace now (`KERAS` outside any context of this module)."""
    return _FORMS.get()


def chosen() -> bool:
    """Whether a context of this module (`use_forms`, ...) chose the current forms, even if
    they equal `KERAS` (an exporter with forms of its own keeps the caller's)."""
    return _FORMS.get(None) is not None


@contextlib.contextmanager
def use_forms(forms: ExportForms | None = None, **changes: Any) -> Iterator[ExportForms]:
    """Within it, the layers trace `forms` (default: the current ones) with `changes` applied."""
    chosen = dataclasses.replace(forms or current(), **changes)
    token = _FORMS.set(chosen)
    try:
        yield chosen
    finally:
        _FORMS.reset(token)


@contextlib.contextmanager
def elementwise_token_pooling() -> Iterator[None]:
    """Trace the separable attention's token sum as a product and a mean, not a matrix product.

    The same function; for exports whose runtime computes in float (Core ML: fp16 or
    fp32), where the matrix product only adds ops (9 `matmul` and 27 `reshape` in
    MobileViTV2-0.5) and the int8 rounding it avoids does not happen.
    """
    with use_forms(token_pooling="product_mean"):
        yield


@contextlib.contextmanager
def int8_forms() -> Iterator[ExportForms]:
    """Trace the forms of a full-int8 graph (`INT8`'s variance), unless the caller chose forms.

    Full-int8 TFLite (`to_tflite(quantization="int8")`) and the QAT twin enter it; within
    a caller's `use_forms` it changes nothing (a benchmark's ablation keeps its forms).
    """
    if chosen():
        yield current()
        return
    with use_forms(variance=INT8.variance) as forms:
        yield forms


@contextlib.contextmanager
def export_call(function: Callable) -> Iterator[None]:
    """Trace every `MobileViTV2Block` inference call as `function(block, inputs)`.

    For exporters that write the same function in another form (Core ML: the
    transformer in channels-first layout, `keras_mvit2.export.coreml.layout`).
    `function` returns the block's output, or `None` to keep the usual `call`.
    Training calls are never redirected.
    """
    token = _EXPORT_CALL.set(function)
    try:
        yield
    finally:
        _EXPORT_CALL.reset(token)


def block_call_override() -> Callable | None:
    """The function `export_call` set for `MobileViTV2Block` inference calls, or None."""
    return _EXPORT_CALL.get()
