"""Which form of the MobileViTv2 transformer math each target traces: chosen here, only here.

The math (`keras_mvit2.layers.functional`) is written once. A few of its steps have two
forms that compute the same function but convert to different programs: one `ExportForms`
value holds one choice per step, and a conversion traces the model inside `tracing(forms)`.

| option: form              | picked by                    | why                                |
|---------------------------|------------------------------|------------------------------------|
| pooling `"matmul"`        | default: Keras, TFLite, twin | int8: BATCH_MATMUL, int32 sums (1) |
| pooling `"product_mean"`  | float runtimes               | float: a matmul only adds ops      |
| pooling `"product_sum"`   | Core ML blocks (2)           | one sum over the last axis         |
| normaliser `"exp_mean"`   | default                      | no TRANSPOSE; int16, int8 safe (3) |
| normaliser `"softmax"`    | Core ML blocks (2)           | one `softmax` op, last axis        |
| variance `"one_pass"`     | default                      | 2 full-tensor ops, not 5 (4)       |
| variance `"one_pass_matmul"` | full int8 (6)             | int8: `E[x^2]` summed in int32 (5) |
| variance `"centred"`      | Core ML blocks (2)           | no cancellation in fp16            |
| unfold `"space_to_depth"` | default                      | no TRANSPOSE channels-last         |
| unfold `"depthwise_conv"` | Core ML blocks (2)           | no transpose channels-first        |
| flow epsilon `"add"`      | default                      | Mobile-Attention's code, eps = 1e-6 |
| flow epsilon `"omit"`     | full int8 (6)                | eps is below one int8 step (7)     |
| products `"as_written"`   | default                      | `a @ b`                            |
| products `"small_second"` | full int8 (6)                | XNNPACK packs the second (8)       |

(1) The element-wise product `e * x` is requantized to 8 bits before the sum and, at
hundreds of tokens, most terms round to zero (`FLOAT_RUNTIME` keeps `"product_mean"` for
float runtimes: the matmul adds 9 matmul and 27 reshape ops to MobileViTV2-0.5).
(2) `MobileViTV2Block`s traced by `keras_mvit2.export.coreml.layout`, with
`keras_mvit2.layers.functional.CHANNELS_FIRST`. (3) `exp(q - max)` is pooled and the pooled
tokens divided once by `mean_N(N * e)`: TFLite's SOFTMAX is last-axis only, LiteRT's int16
SUM is wrong (MEAN is not), and int8 divides by a value >= 1 instead of rounding `1 / N`
scores per token. The division is two products by the sum's `rsqrt`
(`functional.divide_positive`), in every form and under every converter: an int8 sum
near 1 is known only to N / 510 and can round to 0 (LiteRT's int8 DIV fails on it), its
`rsqrt` in [1 / sqrt(N), 1] cannot.
(4) The affine folded into one scale and shift; `x * x`, not SQUARE (SQUARE stays float in
int8 TFLite). The centred form's `E[(x - E[x])^2]` has no `E[x^2] - E[x]^2`
cancellation, which matters in Core ML's fp16. (5) `E[x^2]` as one BATCH_MATMUL per sample
(the flattened tensor times itself), not MEAN of `x * x`: in full int8 `x * x` is rounded to
8 bits per element, and with heavy tails most squares round to zero (docs/int8.md, "The
GroupNorm's squares"). (6) `INT8`: `to_tflite(quantization="int8")` (the file QAT
trains). Float graphs keep `"one_pass"`: the matrix product makes the float32 file 1.41-1.43x
slower (MobileViTV2-0.5 at 256x256, 1 thread, XNNPACK, three interleaved runs of 600
invokes: median 10.0-11.2 against 14.2-15.9 ms), since XNNPACK packs the `K x 1` right
operand to its 16-column tile on every invoke; as a `c x c` Gram matrix of `(K / c, c)` rows
(c = 16 or 32) it still cost 5-9 %. So `KERAS`, what `model(x)`, the plain
`tf.lite.TFLiteConverter` and Keras' `model.export(format="litert")` trace, keeps the MEAN of
`x * x`. With the plain converter's min / max ranges that form measured no worse than the
matrix product (`benchmarks/int8_fidelity.py`, ``plain converter``: 89.7 % agreement against
89.2 % traced with `INT8`, one MobileViTV2-0.5 trained at 256x256; what such a file loses
is the min / max ranges': `to_tflite`'s default file, 97.0 %).

(7) Mobile-Attention (`functional.mobile_attention_flows`) adds its eps (1e-6) to both
factors of every flow dot product, as the authors' code. In full int8 that is below one
step of any of those tensors (a sigmoid's step is 1/256), so each addition only requantizes
a whole tensor in LiteRT's own ADD kernel (XNNPACK refuses a constant that small against
the tensor's scale): MobileViTV2-0.5 with Mobile-Attention, 1 thread, int8 with / without
the additions: 1.37 / 1.02 ms at 64x64, 12.8 / 9.8 ms at 256x256 (float32 1.2 and 15 ms;
`benchmarks/int8_speed.py`). A float graph keeps them (the function of the code; without
them the flows differ by about 1e-6 relative).

(8) `functional.product(a, b)`, the attentions' products of two run-time tensors (MHA's and
Linformer's scores and weighted values, Linformer's token projections, RFA's and
Mobile-Attention's state products): XNNPACK's int8 BATCH_MATMUL packs its second operand on
every invoke (about 1 ns an element, scalar code), which at small token counts costs more
than the product (a `(1 x 32) @ (32 x 256)` per head: 0.17 ms int8 against 0.04 ms float32),
so full int8 computes `(b^T a^T)^T` where the second operand would be the larger, or where
the first is a constant (it is then packed once, when the file loads). A run-time second
operand that the math can produce transposed, `(..., N, K)`, is taken so (the adjoint flag):
XNNPACK packs it row by row, where a `(..., K, N)` one costs a gather per invoke (Linformer's
`F v`, `functional.linformer_attention`: 45 against 68 us for its weighted sum at 16
tokens, Intel host, `benchmarks/results/int8_speed_intel/`).

Presets: `KERAS` (the default, everything the first row), `INT8` (`KERAS` with the
`"one_pass_matmul"` variance, the flow epsilon omitted and `"small_second"` products),
`FLOAT_RUNTIME` (`KERAS` with `"product_mean"` pooling: Core ML traced channels-last, the
PyTorch road, the optimizer's float candidates) and `COREML_CHANNELS_FIRST` (the Core ML
block trace with `keras_mvit2.layers.functional.CHANNELS_FIRST`).

How a conversion picks them: it resolves one `ExportForms` value (`to_tflite`: its `forms`
argument, else the quantization's own, `TFLiteQuantization.forms`) and traces the model
inside `tracing(forms)`; the layers read `current()`. `tracing`'s `block_call` also
redirects every `MobileViTV2Block` inference call to an exporter's function (Core ML:
`keras_mvit2.export.coreml.layout.channels_first_block`). Every `.tflite` records its forms
in its metadata (``forms``), which `mvit2 export` prints.

This module imports neither Keras nor TensorFlow (the tf_keras twin imports it too).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from typing import Literal

__all__ = [
    "COREML_CHANNELS_FIRST",
    "FLOAT_RUNTIME",
    "INT8",
    "KERAS",
    "ExportForms",
    "current",
    "current_block_call",
    "tracing",
]

TokenPooling = Literal["matmul", "product_mean", "product_sum"]
TokenNormaliser = Literal["exp_mean", "softmax"]
Variance = Literal["one_pass", "one_pass_matmul", "centred"]
UnfoldForm = Literal["space_to_depth", "depthwise_conv"]
FlowEpsilon = Literal["add", "omit"]
ProductOrder = Literal["as_written", "small_second"]


@dataclasses.dataclass(frozen=True)
class ExportForms:
    """One choice per option of the shared math (see the module docstring's table)."""

    token_pooling: TokenPooling = "matmul"
    token_normaliser: TokenNormaliser = "exp_mean"
    variance: Variance = "one_pass"
    unfold: UnfoldForm = "space_to_depth"
    flow_epsilon: FlowEpsilon = "add"
    products: ProductOrder = "as_written"

    def __post_init__(self) -> None:
        allowed = {
            "token_pooling": ("matmul", "product_mean", "product_sum"),
            "token_normaliser": ("exp_mean", "softmax"),
            "variance": ("one_pass", "one_pass_matmul", "centred"),
            "unfold": ("space_to_depth", "depthwise_conv"),
            "flow_epsilon": ("add", "omit"),
            "products": ("as_written", "small_second"),
        }
        for field, values in allowed.items():
            if getattr(self, field) not in values:
                raise ValueError(
                    f"ExportForms.{field} must be one of {values}. "
                    f"Received: {field}={getattr(self, field)!r}"
                )


#: Keras training and inference (`model(x)`: also what the plain TFLite converter and Keras'
#: LiteRT export trace), every TFLite format but full int8, the tf_keras twin.
KERAS = ExportForms()
#: Full-int8 TFLite: `KERAS` with the GroupNorm's `E[x^2]` as a matrix product, summed in
#: int32 (5); not `KERAS`'s, for float speed (6); Mobile-Attention's flow epsilon omitted,
#: below one int8 step (7); the smaller operand of each product second (8).
INT8 = dataclasses.replace(KERAS, variance="one_pass_matmul", flow_epsilon="omit",
                           products="small_second")
#: Float runtimes (Core ML traced channels-last, the PyTorch road, float candidates): the
#: token sum as a product and a mean, where the matrix product only adds ops (1).
FLOAT_RUNTIME = dataclasses.replace(KERAS, token_pooling="product_mean")
#: Core ML: the `MobileViTV2Block` transformer traced channels-first
#: (`keras_mvit2.export.coreml.layout`).
COREML_CHANNELS_FIRST = ExportForms(
    token_pooling="product_sum", token_normaliser="softmax", variance="centred",
    unfold="depthwise_conv",
)

#: What `tracing` set: `(forms, block_call)`.
_TRACING: contextvars.ContextVar[tuple[ExportForms, Callable | None]] = contextvars.ContextVar(
    "keras_mvit2_export_tracing", default=(KERAS, None)
)


def current() -> ExportForms:
    """The forms the layers trace now (`KERAS` outside `tracing`)."""
    return _TRACING.get()[0]


def current_block_call() -> Callable | None:
    """The function `tracing` set for `MobileViTV2Block` inference calls, or None."""
    return _TRACING.get()[1]


@contextlib.contextmanager
def tracing(forms: ExportForms, *, block_call: Callable | None = None) -> Iterator[ExportForms]:
    """Within it, the layers trace `forms`; a conversion enters it around its trace.

    Args:
        forms: the forms of the shared math (a preset of this module, or any `ExportForms`).
        block_call: a function `(block, inputs) -> output` for every `MobileViTV2Block`
            inference call, or `None` to keep the usual `call` (it may also return `None`
            for a block it does not handle). Training calls are never redirected.
    """
    if not isinstance(forms, ExportForms):
        raise TypeError(f"forms must be an ExportForms (keras_mvit2.layers.export_forms). "
                        f"Received: forms={forms!r}")
    token = _TRACING.set((forms, block_call))
    try:
        yield forms
    finally:
        _TRACING.reset(token)
