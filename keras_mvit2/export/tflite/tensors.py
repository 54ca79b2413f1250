"""`TensorDetails`: one input or output of a TFLite model, as reports and metadata show it."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from keras_mvit2.export.tflite.flatbuffer import TENSOR_TYPE_NAMES, decode_name, tensor_indices


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


def io_tensors(model: Any) -> tuple[list[TensorDetails], list[TensorDetails]]:
    """The inputs and outputs of a parsed model's (`ModelT`'s) main subgraph."""
    if not model.subgraphs:
        return [], []
    main = model.subgraphs[0]
    return ([_tensor_details(main.tensors[i]) for i in tensor_indices(main.inputs)],
            [_tensor_details(main.tensors[i]) for i in tensor_indices(main.outputs)])


def _tensor_details(tensor: Any) -> TensorDetails:
    shape = tuple(int(d) for d in (tensor.shape if tensor.shape is not None else ()))
    signature = tensor.shapeSignature
    signature = shape if signature is None else tuple(int(d) for d in signature)
    q = tensor.quantization
    scales = [] if q is None or q.scale is None else list(q.scale)
    zeros = [] if q is None or q.zeroPoint is None else list(q.zeroPoint)
    scale = float(scales[0]) if scales else 0.0
    zero = int(zeros[0]) if zeros else 0
    return TensorDetails(
        name=decode_name(tensor.name),
        shape=shape,
        shape_signature=signature,
        dtype=TENSOR_TYPE_NAMES.get(int(tensor.type), f"type_{tensor.type}"),
        quantization=(scale, zero),
    )
