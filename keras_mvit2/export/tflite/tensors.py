"""`TensorDetails`: one input or output of a TFLite model, as reports and metadata show it."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


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
