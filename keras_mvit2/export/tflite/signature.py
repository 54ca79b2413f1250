"""The ``serving_default`` SignatureDef of our `.tflite` files: named input and outputs.

`to_tflite` converts from a concrete function with no trackable object, which writes no
SignatureDef, so LiteRT's signature runner and tools that feed a model by signature
(ai-edge-quantizer's calibration) cannot use the file. `add_serving_signature` writes the
``serving_default`` of Keras' own LiteRT export into the flatbuffer, mapping names to the
main subgraph's input and output tensors; the tensors themselves are unchanged.

Names (`serving_output_names`, from the output shapes as `task_of_outputs` reads them):

=======================  =====================================================================
task                     outputs
=======================  =====================================================================
classifier ``(B, C)``    ``logits``, or ``probabilities`` when the model ends in softmax
segmenter ``(B,H,W,C)``  ``logits`` / ``probabilities`` (per-pixel class scores)
raw SSD ``(B, A, 4+C)``  ``raw_predictions`` (per anchor: 4 box offsets, then class logits)
post-processed detector  ``location``, ``category``, ``score``, ``number of detections``: the
                         names of the standard metadata, which MediaPipe's ObjectDetector reads
anything else            ``output_0``, ``output_1``, ...
=======================  =====================================================================

The input is ``image`` (one input; ``input_0``, ... for several). Every file we write
carries the signature (`keras_mvit2.export.tflite.metadata.serialize_with_metadata`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ai_edge_litert import schema_py_generated as tfl_schema

from keras_mvit2.export.tflite.flatbuffer import (
    decode_name,
    parse_flatbuffer,
    serialize_flatbuffer,
    tensor_indices,
)
from keras_mvit2.export.tflite.standard_metadata import DETECTION_OUTPUT_NAMES, task_of_outputs

__all__ = [
    "SERVING_INPUT_NAME",
    "SERVING_SIGNATURE",
    "add_serving_signature",
    "serving_output_names",
    "set_serving_signature",
]

#: The signature key every file gets (the one Keras, TF Serving and the quantizer use).
SERVING_SIGNATURE = "serving_default"
#: The name of the (one) image input in the signature.
SERVING_INPUT_NAME = "image"
#: The output of a raw SSD head (no post-processing op).
RAW_DETECTION_NAME = "raw_predictions"


def serving_output_names(output_shapes: Sequence[Sequence[int]],
                         output_kind: str = "logits") -> list[str]:
    """The signature's output names for a model with these output shapes (see the table in
    the module docstring).

    Args:
        output_shapes: each output's shape (``shape_signature``, batch first).
        output_kind: ``"logits"`` or ``"probabilities"`` (`tflite_metadata`'s
            ``output_kind``: the model ends in softmax).

    Returns:
        One name per output, in the subgraph's output order.
    """
    if output_kind not in ("logits", "probabilities"):
        raise ValueError(
            "output_kind must be 'logits' or 'probabilities'. "
            f"Received: output_kind={output_kind!r}"
        )
    task = task_of_outputs(output_shapes)
    if task in ("classifier", "segmenter"):
        return [output_kind]
    if task == "detector":
        return [RAW_DETECTION_NAME]
    if task == "detector_postprocessed":
        return list(DETECTION_OUTPUT_NAMES)
    return [f"output_{i}" for i in range(len(output_shapes))]


def add_serving_signature(flatbuffer: bytes, output_names: Sequence[str],
                          input_names: Sequence[str] | None = None) -> bytes:
    """`flatbuffer` with a ``serving_default`` SignatureDef over its main subgraph.

    Any previous ``serving_default`` is replaced, other signatures are kept. Re-serializing
    drops an appended zip archive (the standard metadata's labels): call this before
    `embed_standard_metadata` (`embed_all_metadata` does).

    Args:
        flatbuffer: a `.tflite` model (bytes).
        output_names: one name per output of subgraph 0, in order (`serving_output_names`).
        input_names: one name per input; default ``["image"]`` for one input,
            ``input_0``, ... for several.

    Returns:
        The model bytes with the signature.

    Raises:
        ValueError: the number of names does not match the subgraph's inputs / outputs, or
            a name repeats.
    """
    model = parse_flatbuffer(flatbuffer)
    set_serving_signature(model, output_names, input_names)
    return serialize_flatbuffer(model, len(flatbuffer) + 4096)


def set_serving_signature(model: Any, output_names: Sequence[str],
                          input_names: Sequence[str] | None = None) -> None:
    """`add_serving_signature` on a parsed model (`ModelT`, edited in place)."""
    subgraph = model.subgraphs[0]
    inputs, outputs = tensor_indices(subgraph.inputs), tensor_indices(subgraph.outputs)
    if input_names is None:
        input_names = (
            [SERVING_INPUT_NAME] if len(inputs) == 1 else [f"input_{i}" for i in range(len(inputs))]
        )
    for kind, names, tensors in (("input", input_names, inputs), ("output", output_names, outputs)):
        if len(names) != len(tensors) or len(set(names)) != len(names):
            raise ValueError(
                f"The signature needs one distinct {kind} name per {kind} tensor: the model has "
                f"{len(tensors)} {kind}s. Received: {list(names)}"
            )
    signature = tfl_schema.SignatureDefT()
    signature.signatureKey = SERVING_SIGNATURE
    signature.subgraphIndex = 0
    signature.inputs = [tensor_map(n, i) for n, i in zip(input_names, inputs, strict=True)]
    signature.outputs = [tensor_map(n, i) for n, i in zip(output_names, outputs, strict=True)]
    kept = [s for s in (model.signatureDefs or [])
            if decode_name(s.signatureKey) != SERVING_SIGNATURE]
    model.signatureDefs = [signature, *kept]


def tensor_map(name: str, index: int) -> Any:
    """A signature entry: `name` -> tensor `index`."""
    entry = tfl_schema.TensorMapT()
    entry.name = str(name)
    entry.tensorIndex = int(index)
    return entry
