"""The TFLite files `keras_mvit2.export.optimizer` tries, each measured in LiteRT here.

| candidate                    | made by the TFLite converter                      |
|------------------------------|---------------------------------------------------|
| `float32`, `float16`         | token sum as a matrix product (the int8-safe form) |
| `float32_product_mean`, ...  | token sum as product-and-mean (Core ML's form)     |
| `dynamic_int8`               | int8 weights, float activations                    |
| `int8`                       | full int8 (`mvit2 export`'s int8 file)             |
| `int16x8`                    | int16 activations, int8 weights, whole model       |

Both forms of the attention's token sum are exact (`keras_mvit2.layers.export_forms`);
which one runs faster depends on the runtime, so the float formats are built in both and
the optimizer's latency tie-break keeps the faster one where sizes are equal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mvit2.export.candidate import Candidate

__all__ = ["tflite_candidates"]

_MEASURED_BY = "LiteRT"


def tflite_candidates(model: Any, *, calibration_data: np.ndarray,
                      class_names: Sequence[str] | None = None) -> list[Candidate]:
    """The TFLite candidates for `model` (see the module docstring)."""
    from keras_mvit2.export.tflite.convert import to_tflite
    from keras_mvit2.layers.export_forms import elementwise_token_pooling

    names = list(class_names) if class_names is not None else None

    def converter(quantization: str, *, product_mean: bool = False, **options: Any):
        def build(path: str) -> Any:
            context = elementwise_token_pooling() if product_mean else contextlib.nullcontext()
            recipe = {"optimizer_candidate": _name(quantization, product_mean)}
            with context:
                return to_tflite(model, path, quantization=quantization, class_names=names,
                                 representative_data=(calibration_data if quantization in
                                                      ("int8", "int16x8") else None),
                                 num_calibration_samples=len(calibration_data),
                                 metadata=recipe, **options)
        return build

    candidates = []
    for quantization in ("float32", "float16"):
        for product_mean in (False, True):
            candidates.append(Candidate(
                _name(quantization, product_mean),
                {"quantization": quantization,
                 "token_sum": "product_mean" if product_mean else "matmul",
                 "quantizer": "TFLite converter"},
                converter(quantization, product_mean=product_mean), _MEASURED_BY))
    for quantization in ("dynamic_int8", "int8", "int16x8"):
        candidates.append(Candidate(
            quantization, {"quantization": quantization, "quantizer": "TFLite converter",
                           **({"calibration_images": len(calibration_data)}
                              if quantization in ("int8", "int16x8") else {})},
            converter(quantization), _MEASURED_BY))
    return candidates


def _name(quantization: str, product_mean: bool) -> str:
    return quantization + ("_product_mean" if product_mean else "")
