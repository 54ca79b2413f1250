"""Standard TFLite Model Metadata (``TFLITE_METADATA``), the one MediaPipe Tasks, the TFLite
Task Library and Android Studio's ML model binding read.

The metadata is a ``ModelMetadata`` flatbuffer (the official ``metadata_schema.fbs``, Python
code generated with ``flatc``: see ``metadata_schema/README.md``) stored in a buffer of
the model under the metadata name ``"TFLITE_METADATA"``; the files it names (the labels) are
packed, uncompressed, in a zip archive appended to the model file, as tflite-support's
``MetadataPopulator`` does. The model stays a valid ``.tflite`` file (the interpreter ignores
the trailing archive) and the archive is a valid zip (offsets are absolute).

What `to_tflite` writes for an image model (input ``(1, H, W, 3)``):

* input: ``ImageProperties`` (RGB, ``W x H``), ``NormalizationOptions`` mean 0, std 255 (the
  client's 0-255 pixels become the [0, 1] input the model was trained on), value range 0..255;
  for a uint8 input the quantization parameters are scale 1/255, zero point 0, which is the
  same mapping (the client feeds the raw pixels);
* classifier output ``(1, C)``: ``FeatureProperties``, the range [0, 1] for probabilities,
  and the class names as ``labels.txt`` (``TENSOR_AXIS_LABELS``);
* segmenter output ``(1, H', W', C)``: ``ImageProperties`` (grayscale, the per-pixel class
  scores), ``labels.txt`` (``TENSOR_AXIS_LABELS``);
* detector with in-graph post-processing (4 outputs): ``location`` (``BoundingBoxProperties``
  ymin, xmin, ymax, xmax as ratios), ``category`` (``labels.txt``, ``TENSOR_VALUE_LABELS``),
  ``score`` and ``number of detections``, the names MediaPipe's ``ObjectDetector`` looks for;
* any other output (e.g. the raw SSD predictions): ``FeatureProperties`` only.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as tfl_schema

from keras_mvit2.export.tflite.flatbuffer import (
    decode_name,
    parse_flatbuffer,
    read_flatbuffer,
    serialize_flatbuffer,
)
from keras_mvit2.export.tflite.metadata_schema import metadata_schema_py_generated as md

__all__ = [
    "LABELS_FILE",
    "STANDARD_METADATA_NAME",
    "add_standard_metadata",
    "append_packed_files",
    "embed_standard_metadata",
    "image_model_metadata",
    "read_standard_metadata",
    "set_standard_metadata",
    "standard_metadata_for",
    "task_of_outputs",
]

#: Name of the model metadata entry the clients look up.
STANDARD_METADATA_NAME = "TFLITE_METADATA"
#: Identifier of the ``ModelMetadata`` flatbuffer (``file_identifier`` of the schema).
_FILE_IDENTIFIER = b"M001"
#: Oldest metadata parser that reads every field written here (all from schema 1.0.0).
MIN_PARSER_VERSION = "1.0.0"
#: Name of the packed labels file.
LABELS_FILE = "labels.txt"
#: The tensor names MediaPipe's ObjectDetector looks for, in the op's output order.
DETECTION_OUTPUT_NAMES = ("location", "category", "score", "number of detections")

_TASKS = ("classifier", "segmenter", "detector", "detector_postprocessed", "other")


def _image_input(name: str, height: int, width: int, dtype: str,
                 quantization: tuple[float, int]) -> Any:
    """Input `TensorMetadataT`: RGB image, pixel / 255 (checked against uint8 quantization)."""
    scale, zero_point = quantization
    if dtype == "uint8" and not (abs(scale * 255.0 - 1.0) < 1e-6 and zero_point == 0):
        raise ValueError(
            f"The uint8 input is quantized with scale {scale} and zero point {zero_point}; "
            "clients feed raw 0-255 pixels, so it must be scale 1/255, zero point 0. "
            "Fix: export with io_dtype='float32', or calibrate on images covering 0..1."
        )
    properties = md.ImagePropertiesT()
    properties.colorSpace = md.ColorSpaceType.RGB
    properties.defaultSize = md.ImageSizeT()
    properties.defaultSize.width, properties.defaultSize.height = int(width), int(height)
    normalization = md.NormalizationOptionsT()
    normalization.mean, normalization.std = [0.0], [255.0]
    unit = md.ProcessUnitT()
    unit.optionsType = md.ProcessUnitOptions.NormalizationOptions
    unit.options = normalization
    tensor = md.TensorMetadataT()
    tensor.name = name
    tensor.description = (
        f"RGB image {width}x{height}; the model computes on pixel / 255 (values in [0, 1])."
    )
    tensor.content = _content(md.ContentProperties.ImageProperties, properties)
    tensor.processUnits = [unit]
    tensor.stats = _stats(0.0, 255.0)
    return tensor


def _content(kind: int, properties: Any) -> Any:
    content = md.ContentT()
    content.contentPropertiesType, content.contentProperties = kind, properties
    return content


def _stats(low: float | None, high: float | None) -> Any:
    stats = md.StatsT()
    stats.min = None if low is None else [float(low)]
    stats.max = None if high is None else [float(high)]
    return stats


def _labels(kind: int) -> Any:
    labels = md.AssociatedFileT()
    labels.name = LABELS_FILE
    labels.description = "Class names, one per line, in output order."
    labels.type = kind
    return labels


def _feature_output(name: str, description: str, *, low: float | None = None,
                    high: float | None = None, labels: int | None = None) -> Any:
    content = _content(md.ContentProperties.FeatureProperties, md.FeaturePropertiesT())
    tensor = md.TensorMetadataT()
    tensor.name, tensor.description, tensor.content = name, description, content
    tensor.stats = _stats(low, high)
    if labels is not None:
        tensor.associatedFiles = [_labels(labels)]
    return tensor


def _segmentation_output(description: str) -> Any:
    properties = md.ImagePropertiesT()
    properties.colorSpace = md.ColorSpaceType.GRAYSCALE
    content = _content(md.ContentProperties.ImageProperties, properties)
    content.range = md.ValueRangeT()
    content.range.min, content.range.max = 1, 2
    tensor = md.TensorMetadataT()
    tensor.name, tensor.description, tensor.content = "segmentation_masks", description, content
    tensor.associatedFiles = [_labels(md.AssociatedFileType.TENSOR_AXIS_LABELS)]
    return tensor


def _detection_outputs() -> list[Any]:
    """The four `TFLite_Detection_PostProcess` outputs, as MediaPipe's ObjectDetector reads them."""
    def ranged(tensor: Any) -> Any:
        tensor.content.range = md.ValueRangeT()
        tensor.content.range.min, tensor.content.range.max = 2, 2
        return tensor

    box = md.BoundingBoxPropertiesT()
    box.index = [1, 0, 3, 2]  # the op writes ymin, xmin, ymax, xmax
    box.type = md.BoundingBoxType.BOUNDARIES
    box.coordinateType = md.CoordinateType.RATIO
    location = _feature_output(DETECTION_OUTPUT_NAMES[0], "Boxes ymin, xmin, ymax, xmax in [0, 1].")
    location.content.contentPropertiesType = md.ContentProperties.BoundingBoxProperties
    location.content.contentProperties = box
    category = _feature_output(DETECTION_OUTPUT_NAMES[1], "Class index of each box (into "
                               "labels.txt).", labels=md.AssociatedFileType.TENSOR_VALUE_LABELS)
    score = _feature_output(DETECTION_OUTPUT_NAMES[2], "Score of each box.", low=0.0, high=1.0)
    count = _feature_output(DETECTION_OUTPUT_NAMES[3], "Number of valid boxes.")
    return [ranged(location), ranged(category), ranged(score), count]


def image_model_metadata(
    *,
    task: str,
    name: str,
    input_name: str,
    input_shape: Sequence[int],
    input_dtype: str,
    input_quantization: tuple[float, int],
    output_names: Sequence[str],
    output_kind: str = "logits",
    class_names: Sequence[str] | None = None,
    description: str | None = None,
    version: str | None = None,
) -> tuple[bytes, dict[str, bytes]]:
    """The ``ModelMetadata`` flatbuffer and its associated files for an image model.

    Args:
        task: ``"classifier"`` (output ``(1, C)``), ``"segmenter"`` (``(1, H', W', C)``),
            ``"detector"`` (raw SSD output), ``"detector_postprocessed"`` (the four outputs of
            ``TFLite_Detection_PostProcess``) or ``"other"``.
        name: the model's name.
        input_name: the image input's tensor name.
        input_shape: the image input's shape ``(batch, height, width, 3)``.
        input_dtype: the image input's type (``"float32"``, ``"uint8"``, ``"int8"``, ...).
        input_quantization: the image input's ``(scale, zero_point)``.
        output_names: the output tensor names (used for outputs without a standard name).
        output_kind: ``"probabilities"`` (softmax, range [0, 1]) or ``"logits"``.
        class_names: written as ``labels.txt`` (omitted when ``None``).
        description: free text for the model.
        version: the model's version string.

    Returns:
        ``(metadata, files)``: the flatbuffer bytes and ``{file name: content}``.

    Raises:
        ValueError: not a 3-channel image input, an unknown `task`, or a uint8 input whose
            quantization is not scale 1/255, zero point 0.
    """
    if task not in _TASKS:
        raise ValueError(f"task must be one of {_TASKS}. Received: task={task!r}")
    if len(input_shape) != 4 or int(input_shape[3]) != 3:
        raise ValueError(
            "Standard image metadata needs an RGB image input (batch, height, width, 3). "
            f"Received: input shape {tuple(input_shape)}"
        )
    files: dict[str, bytes] = {}
    if class_names is not None:
        files[LABELS_FILE] = ("\n".join(class_names) + "\n").encode("utf-8")
    labelled = class_names is not None
    if task == "classifier":
        probabilities = output_kind == "probabilities"
        outputs = [_feature_output(
            "probability" if probabilities else "logits",
            f"{'Probabilities' if probabilities else 'Logits'} of the classes.",
            low=0.0 if probabilities else None, high=1.0 if probabilities else None,
            labels=md.AssociatedFileType.TENSOR_AXIS_LABELS if labelled else None,
        )]
    elif task == "segmenter":
        outputs = [_segmentation_output("Per-pixel class logits; argmax gives the class.")]
        if not labelled:
            outputs[0].associatedFiles = None
    elif task == "detector_postprocessed":
        outputs = _detection_outputs()
        if not labelled:
            outputs[1].associatedFiles = None
    else:
        outputs = [_feature_output(str(n), "Raw model output.") for n in output_names]

    subgraph = md.SubGraphMetadataT()
    subgraph.name = name
    subgraph.inputTensorMetadata = [_image_input(
        input_name, int(input_shape[1]), int(input_shape[2]), input_dtype, input_quantization
    )]
    subgraph.outputTensorMetadata = outputs
    model = md.ModelMetadataT()
    model.name = name
    model.description = description or f"keras_mvit2 image {task}."
    model.version = version
    model.author = "keras_mvit2"
    model.license = "Apache License, Version 2.0"
    model.minParserVersion = MIN_PARSER_VERSION
    model.subgraphMetadata = [subgraph]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=_FILE_IDENTIFIER)
    return bytes(builder.Output()), files


def embed_standard_metadata(flatbuffer: bytes, metadata: bytes,
                            files: Mapping[str, bytes]) -> bytes:
    """`flatbuffer` with `metadata` as its ``TFLITE_METADATA`` entry and `files` appended.

    Any previous ``TFLITE_METADATA`` entry and appended archive are dropped. The files are
    stored uncompressed (the clients read them in place). Re-serializing the model later
    drops the archive: call this last.
    """
    model = parse_flatbuffer(flatbuffer)
    set_standard_metadata(model, metadata)
    return append_packed_files(
        serialize_flatbuffer(model, len(flatbuffer) + len(metadata) + 4096), files)


def set_standard_metadata(model: Any, metadata: bytes) -> None:
    """`model` (a parsed `ModelT`, edited in place) with `metadata` as its
    ``TFLITE_METADATA`` entry (any previous one dropped); the packed files are appended to
    the serialized bytes afterwards (`append_packed_files`)."""
    buffer = tfl_schema.BufferT()
    buffer.data = np.frombuffer(metadata, dtype=np.uint8)
    model.buffers = [*(model.buffers or []), buffer]
    entry = tfl_schema.MetadataT()
    entry.name = STANDARD_METADATA_NAME
    entry.buffer = len(model.buffers) - 1
    kept = [m for m in (model.metadata or []) if decode_name(m.name) != STANDARD_METADATA_NAME]
    model.metadata = [*kept, entry]


#: The date of every file in the appended archive.
ARCHIVE_DATE = (1980, 1, 1, 0, 0, 0)


def append_packed_files(flatbuffer: bytes, files: Mapping[str, bytes]) -> bytes:
    """`flatbuffer` (serialized, with no archive yet) with `files` appended as an
    uncompressed zip archive, where the clients read the standard metadata's files."""
    out = io.BytesIO(flatbuffer)
    out.seek(0, io.SEEK_END)
    if files:
        with zipfile.ZipFile(out, "a", compression=zipfile.ZIP_STORED) as archive:
            for file_name, content in files.items():
                # A fixed date (zip's earliest) rather than the clock's: the same model
                # exports to the same bytes, whenever it is exported.
                entry = zipfile.ZipInfo(file_name, date_time=ARCHIVE_DATE)
                entry.external_attr = 0o644 << 16  # -rw-r--r--, as writestr gives
                archive.writestr(entry, content)
    return out.getvalue()


#: Enum-valued fields of the object API: (class name or "*", field) -> enum.
_ENUMS = {
    ("*", "contentPropertiesType"): md.ContentProperties,
    ("*", "optionsType"): md.ProcessUnitOptions,
    ("AssociatedFileT", "type"): md.AssociatedFileType,
    ("ImagePropertiesT", "colorSpace"): md.ColorSpaceType,
    ("BoundingBoxPropertiesT", "type"): md.BoundingBoxType,
    ("BoundingBoxPropertiesT", "coordinateType"): md.CoordinateType,
}


def _to_plain(value: Any) -> Any:
    """An object-API value as JSON-able data: enums by name, vectors as lists."""
    if isinstance(value, bytes):
        return decode_name(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    if not hasattr(value, "__dict__"):
        return value
    plain = {}
    for key, item in vars(value).items():
        if item is None:
            continue
        enum = _ENUMS.get((type(value).__name__, key)) or _ENUMS.get(("*", key))
        plain[key] = _enum_name(enum, item) if enum else _to_plain(item)
    return plain


def _enum_name(enum: type, value: int) -> str:
    names = [k for k, v in vars(enum).items() if not k.startswith("_") and v == value]
    return names[0] if names else str(value)


def read_standard_metadata(path_or_bytes: str | os.PathLike | bytes) -> dict[str, Any] | None:
    """The ``TFLITE_METADATA`` of a model as plain data, or ``None`` when it has none.

    Returns the ``ModelMetadata`` fields (object-API names: ``name``, ``minParserVersion``,
    ``subgraphMetadata[0].inputTensorMetadata[0].processUnits``, ...; union and enum values
    by name) plus ``"associatedFileContents"``: ``{file name: text}`` for the files packed
    in the appended zip archive.
    """
    if isinstance(path_or_bytes, bytes | bytearray):
        data = bytes(path_or_bytes)
    else:
        with open(path_or_bytes, "rb") as f:
            data = f.read()
    return standard_metadata_of(read_flatbuffer(data), data)


def standard_metadata_of(model: Any, data: bytes) -> dict[str, Any] | None:
    """`read_standard_metadata` of an already parsed `model` (`ModelT`) and its file bytes."""
    for entry in model.metadata or []:
        if decode_name(entry.name) != STANDARD_METADATA_NAME:
            continue
        raw = bytes(np.asarray(model.buffers[entry.buffer].data, dtype=np.uint8))
        plain = _to_plain(md.ModelMetadataT.InitFromPackedBuf(bytearray(raw), 0))
        plain["associatedFileContents"] = _packed_files(data)
        return plain
    return None


def _packed_files(data: bytes) -> dict[str, str]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return {n: archive.read(n).decode("utf-8") for n in archive.namelist()}
    except zipfile.BadZipFile:
        return {}


def task_of_outputs(output_shapes: Sequence[Sequence[int]]) -> str:
    """The task an image model's outputs say: one ``(B, C)`` output is a classifier, one
    ``(B, H, W, C)`` a segmenter, one ``(B, anchors, 4 + C)`` a raw SSD detector, four outputs
    ``(B, N, 4)``, ``(B, N)``, ``(B, N)``, ``(B,)`` the post-processed detector."""
    ranks = [len(s) for s in output_shapes]
    if ranks == [2]:
        return "classifier"
    if ranks == [4]:
        return "segmenter"
    if ranks == [3]:
        return "detector"
    if ranks == [3, 2, 2, 1]:
        return "detector_postprocessed"
    return "other"


def add_standard_metadata(flatbuffer: bytes, info: Mapping[str, Any],
                          output_shapes: Sequence[Sequence[int]],
                          output_names: Sequence[str]) -> bytes:
    """`flatbuffer` with the standard metadata built from `to_tflite`'s JSON `info` (see
    `keras_mvit2.export.tflite.tflite_metadata`); unchanged when the input is not an RGB
    image ``(batch, height, width, 3)``."""
    built = standard_metadata_for(info, output_shapes, output_names)
    return flatbuffer if built is None else embed_standard_metadata(flatbuffer, *built)


def standard_metadata_for(info: Mapping[str, Any], output_shapes: Sequence[Sequence[int]],
                          output_names: Sequence[str]) -> tuple[bytes, dict[str, bytes]] | None:
    """The standard metadata and its packed files (`image_model_metadata`) built from
    `to_tflite`'s JSON `info`; None when the input is not an RGB image
    ``(batch, height, width, 3)``."""
    tensor = info.get("input") or {}
    shape = tensor.get("shape") or []
    if len(shape) != 4 or shape[3] != 3:
        return None
    return image_model_metadata(
        task=task_of_outputs(output_shapes),
        name=str(info.get("model") or "model"),
        input_name=tensor["name"],
        input_shape=shape,
        input_dtype=tensor["dtype"],
        input_quantization=(tensor["scale"], tensor["zero_point"]),
        output_names=output_names,
        output_kind=str(info.get("output_kind") or "logits"),
        class_names=info.get("class_names"),
        version=info.get("keras_mvit2_version"),
    )
