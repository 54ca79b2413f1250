"""keras_mvit2's JSON metadata in a `.tflite` file: what `to_tflite` writes and reads back.

A JSON document (`tflite_metadata`: preprocessing, class names, quantization, the I/O
quantization parameters, ...) is stored in the flatbuffer's ``metadata`` list under the name
``"keras_mvit2"`` (`embed_metadata`); `embed_all_metadata` adds it together with the
standard TFLite Model Metadata (`keras_mvit2.export.tflite.standard_metadata`), and
`read_tflite_metadata` reads both back.

Every writer of our `.tflite` files (`to_tflite`, `to_tflite_via_torch`, the ai-edge-quantizer
files, QAT) parses the converter's flatbuffer once, edits that one `ModelT` in place (1x1
fusion, detection post-processing, then `serialize_with_metadata`: signature, JSON, standard
metadata) and serializes it once; the bytes-to-bytes functions (`embed_all_metadata`,
`embed_metadata`, ...) do the same edits on a file's bytes, for tools.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema

from keras_mvit2.export.tflite.flatbuffer import (
    decode_name,
    parse_flatbuffer,
    read_flatbuffer,
    serialize_flatbuffer,
)
from keras_mvit2.export.tflite.pointwise_fusion import PointwiseFusion
from keras_mvit2.export.tflite.signature import serving_output_names, set_serving_signature
from keras_mvit2.export.tflite.standard_metadata import (
    append_packed_files,
    set_standard_metadata,
    standard_metadata_for,
    standard_metadata_of,
)
from keras_mvit2.export.tflite.tensors import TensorDetails, io_tensors
from keras_mvit2.layers.export_forms import ExportForms

__all__ = [
    "METADATA_FORMAT",
    "METADATA_NAME",
    "METADATA_VERSION",
    "embed_all_metadata",
    "embed_metadata",
    "forms_entry",
    "read_tflite_metadata",
    "serialize_with_metadata",
    "set_metadata_entry",
    "tensor_entry",
    "tflite_metadata",
]

#: Name of the JSON entry that `to_tflite` writes into the flatbuffer's `metadata`.
METADATA_NAME = "keras_mvit2"
METADATA_FORMAT = "keras_mvit2.tflite_metadata"
METADATA_VERSION = 1


def tflite_metadata(
    model: keras.Model,
    *,
    inputs: Sequence[TensorDetails],
    outputs: Sequence[TensorDetails],
    quantization: str,
    batch_size: int | None,
    class_names: list[str] | None = None,
    calibration: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
    fused_pointwise: Sequence[PointwiseFusion] | None = None,
    converter: Mapping[str, str] | None = None,
    forms: ExportForms | None = None,
) -> dict[str, Any]:
    """The JSON document that `to_tflite` stores in the file (and the sidecar).

    Keys: ``format``/``version`` (``"keras_mvit2.tflite_metadata"``, 1), ``model`` (Keras
    model name), ``attention`` (the attention layers inside, e.g. ``["separable"]``:
    `keras_mvit2.attention.names_in`), ``keras_mvit2_version``, ``quantization``,
    ``batch_size`` (``None``: dynamic), ``preprocessing`` (``color_space`` ``"RGB"``,
    ``layout`` ``"NHWC"``, ``input_size`` ``[height, width]``, ``scale`` 1/255 and
    ``offset`` 0: the model input is ``pixel * scale + offset``, i.e. RGB in [0, 1]),
    ``input``/``output`` (name, shape, dtype and quantization ``scale`` / ``zero_point`` of
    the model's I/O tensors: for int8/uint8 I/O an app computes ``q = round(x / scale) +
    zero_point`` from the [0, 1] input ``x``, and ``y = (q - zero_point) * scale`` for the
    output), ``output_kind`` (``"probabilities"`` or ``"logits"``), ``class_names`` (or
    ``None``), ``calibration`` (source and number of images, for int8/int16x8),
    ``graph_optimizations`` (``fused_pointwise_convolutions``: how many pairs of 1x1
    convolutions were fused and the ``macs_saved``; ``None`` when fusion was off),
    ``forms`` (the export forms the graph was traced in, `forms_entry` of `forms`, a
    `keras_mvit2.layers.export_forms.ExportForms`; ``None`` when not given), ``user``
    and, for a file made by the torch road (`to_tflite_via_torch`), ``converter``
    (``{"road": "torch", "tool": "litert-torch", "version": ...}``; absent on the
    TensorFlow road).
    """
    from keras_mvit2._version import __version__
    from keras_mvit2.layers.attention_registry import names_in

    shape = tuple(model.inputs[0].shape)
    input_size = [int(d) for d in shape[1:3]] if len(shape) == 4 else None
    activation = getattr(getattr(model.layers[-1], "activation", None), "__name__", "")
    output_kind = "probabilities" if activation == "softmax" else "logits"

    return {
        "format": METADATA_FORMAT,
        "version": METADATA_VERSION,
        "model": model.name,
        "attention": names_in(model),
        "keras_mvit2_version": __version__,
        "quantization": quantization,
        "batch_size": batch_size,
        "preprocessing": {
            "color_space": "RGB",
            "layout": "NHWC",
            "input_size": input_size,
            "scale": 1.0 / 255.0,
            "offset": 0.0,
            "description": "RGB pixels in [0, 255] times 1/255 (no mean/std): [0, 1]",
        },
        "input": tensor_entry(inputs[0]) if inputs else None,
        "output": tensor_entry(outputs[0]) if outputs else None,
        "output_kind": output_kind,
        "class_names": class_names,
        "calibration": calibration,
        "graph_optimizations": None if fused_pointwise is None else {
            "fused_pointwise_convolutions": len(fused_pointwise),
            "macs_saved": int(sum(f.macs_saved for f in fused_pointwise)),
        },
        "forms": None if forms is None else forms_entry(
            forms, (converter or {}).get("road", "tensorflow")),
        "user": user,
        **({"converter": dict(converter)} if converter is not None else {}),
    }


def forms_entry(forms: ExportForms, road: str) -> dict[str, str]:
    """The ``forms`` entry of `tflite_metadata`: which form of each step of the shared math
    the file's graph computes (the fields of `forms`, a
    `keras_mvit2.layers.export_forms.ExportForms`: ``token_pooling``, ``token_normaliser``,
    ``variance`` (the GroupNorm's: ``"one_pass_matmul"`` in a full-int8 file), ``unfold``,
    ``flow_epsilon`` (Mobile-Attention's: ``"omit"`` in a full-int8 file), ``products``
    (the attentions': ``"small_second"`` in a full-int8 file)),
    its ``layout`` (``"channels_last"``: every `.tflite` graph) and the ``road`` that
    converted it (``"tensorflow"`` or ``"torch"``, `keras_mvit2.export.roads`)."""
    return {**dataclasses.asdict(forms), "layout": "channels_last", "road": road}


def tensor_entry(t: TensorDetails) -> dict[str, Any]:
    """The ``input`` / ``output`` entry of `tflite_metadata` for one I/O tensor."""
    scale, zero_point = t.quantization
    return {
        "name": t.name,
        "shape": list(t.shape_signature),
        "dtype": t.dtype,
        "quantized": bool(scale),
        "scale": scale,
        "zero_point": zero_point,
    }


def embed_metadata(flatbuffer: bytes, info: Mapping[str, Any]) -> bytes:
    """Adds (or replaces) the ``"keras_mvit2"`` metadata entry: a buffer holding the JSON."""
    model = parse_flatbuffer(flatbuffer)
    size = set_metadata_entry(model, info)
    return serialize_flatbuffer(model, len(flatbuffer) + size + 4096)


def set_metadata_entry(model: Any, info: Mapping[str, Any]) -> int:
    """`embed_metadata` on a parsed model (`ModelT`, edited in place); returns the JSON's
    size in bytes."""
    data = json.dumps(info, sort_keys=False).encode("utf-8")
    buffer = tfl_schema.BufferT()
    buffer.data = np.frombuffer(data, dtype=np.uint8)
    model.buffers = list(model.buffers or [])
    model.buffers.append(buffer)
    entry = tfl_schema.MetadataT()
    entry.name = METADATA_NAME
    entry.buffer = len(model.buffers) - 1
    kept = [m for m in (model.metadata or []) if decode_name(m.name) != METADATA_NAME]
    model.metadata = [*kept, entry]
    return len(data)


def embed_all_metadata(flatbuffer: bytes, info: Mapping[str, Any],
                       outputs: Sequence[TensorDetails]) -> bytes:
    """`flatbuffer` with the ``serving_default`` signature (`add_serving_signature`: input
    ``image``, outputs named by `serving_output_names`), our JSON entry `info`
    (`tflite_metadata`) and, for an RGB image model, the standard TFLite Model Metadata built
    from it (`outputs`: the file's output tensors, e.g.
    `summarize_flatbuffer(flatbuffer).outputs`)."""
    return serialize_with_metadata(parse_flatbuffer(flatbuffer), info, outputs,
                                   size_hint=len(flatbuffer))


def serialize_with_metadata(model: Any, info: Mapping[str, Any],
                            outputs: Sequence[TensorDetails] | None = None, *,
                            size_hint: int | None = None) -> bytes:
    """The last step of every writer of our `.tflite` files: the parsed `model` (`ModelT`,
    edited in place) with the ``serving_default`` signature, our JSON entry `info` and the
    standard metadata (see `embed_all_metadata`), serialized once, then the standard
    metadata's files appended (`outputs`: the model's output tensors; default read from
    `model`; `size_hint`: the serialized size to reserve, default that of its buffers)."""
    if size_hint is None:
        size_hint = sum(len(b.data) for b in model.buffers or [] if b.data is not None)
    outputs = io_tensors(model)[1] if outputs is None else outputs
    shapes = [t.shape_signature for t in outputs]
    set_serving_signature(
        model, serving_output_names(shapes, str(info.get("output_kind") or "logits")))
    size_hint += set_metadata_entry(model, info) + 4096
    standard = standard_metadata_for(info, shapes, [t.name for t in outputs])
    if standard is None:
        return serialize_flatbuffer(model, size_hint)
    metadata, files = standard
    set_standard_metadata(model, metadata)
    return append_packed_files(  # last: the archive follows the serialized model
        serialize_flatbuffer(model, size_hint + len(metadata)), files)


def _metadata_entry(model, buf: bytes) -> dict[str, Any] | None:
    """The keras_mvit2 JSON entry of `model` (parsed from `buf`), with the standard
    metadata under ``"tflite_metadata"``."""
    for entry in model.metadata or []:
        if decode_name(entry.name) != METADATA_NAME:
            continue
        buffer = model.buffers[entry.buffer]
        if buffer.data is None:
            return None
        try:
            info = json.loads(bytes(np.asarray(buffer.data, dtype=np.uint8)).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        info["tflite_metadata"] = standard_metadata_of(model, buf)
        return info
    return None


def read_tflite_metadata(path: str | os.PathLike) -> dict[str, Any] | None:
    """The ``"keras_mvit2"`` metadata that `to_tflite` wrote into a `.tflite` file, with
    the standard TFLite Model Metadata under ``"tflite_metadata"``.

    ``"tflite_metadata"`` is the ``TFLITE_METADATA`` entry that MediaPipe Tasks and the
    TFLite Task Library read, as plain data with the packed files' contents (see
    `keras_mvit2.export.tflite.standard_metadata.read_standard_metadata`), or ``None``.
    Returns ``None`` for a file without the keras_mvit2 entry (e.g. converted by other
    tools).
    """
    with open(os.fspath(path), "rb") as f:
        buf = f.read()
    return _metadata_entry(read_flatbuffer(buf), buf)
