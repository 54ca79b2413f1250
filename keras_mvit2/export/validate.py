"""Validation of an exported model against its Keras reference, on real held-out images.

`validate` runs an exported `.tflite` in ``ai_edge_litert`` and the Keras model on the same
images and reports what the export lost: max / mean absolute difference of the outputs,
top-1 agreement, accuracy of both, file size, the op histogram (with the ops left in float
in an integer model) and the XNNPACK coverage (partitions, ops taken and left). A Core ML
``.mlpackage`` is compared numerically only on macOS (Core ML's runtime); elsewhere its
structure is reported with a note.

`print_reports` prints reports side by side (rich table), `save_reports` writes them as
JSON (atomically).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from keras_mvit2.export.coreml.target import PREDICTIONS_NOTE
from keras_mvit2.utils.files import write_json

__all__ = [
    "ValidationReport",
    "format_reports",
    "print_reports",
    "reference_outputs",
    "save_reports",
    "validate",
]

#: What a Core ML report says off macOS (the Core ML target's `host_note`).
COREML_LINUX_NOTE = PREDICTIONS_NOTE


@dataclasses.dataclass
class ValidationReport:
    """What an exported model lost against its Keras reference.

    Differences are taken on the model outputs (logits or probabilities, whatever the
    model returns), after dequantizing int8/uint8/int16 outputs. Accuracies and
    agreements are fractions in [0, 1].

    Attributes:
        exported_path: the exported file (or `.mlpackage` folder).
        format: ``"tflite"`` or ``"coreml"``.
        reference: the Keras model's name.
        num_images: images compared.
        size_bytes: size of the exported model on disk.
        reference_size_bytes: the Keras model's weights in float32 (4 bytes per weight).
        quantization: the export's quantization (from its metadata) or None.
        input_dtype / output_dtype: the exported model's I/O types.
        numeric: whether outputs were compared (False for Core ML off macOS).
        max_abs_diff: max |exported - keras| over all outputs.
        mean_abs_diff: mean |exported - keras|.
        max_abs_reference: max |keras output|, the scale of the differences.
        top1_agreement: fraction of images where both models pick the same class.
        accuracy: top-1 accuracy of the exported model on the labels.
        reference_accuracy: top-1 accuracy of the Keras model.
        accuracy_drop: ``reference_accuracy - accuracy``.
        per_class_accuracy: class name -> (exported, keras) accuracy.
        op_histogram: op name -> count.
        float_ops: ops that compute in float (for TFLite; see `TFLiteReport.float_ops`).
        num_ops: total ops.
        num_xnnpack_partitions: XNNPACK DELEGATE nodes (TFLite).
        num_ops_in_xnnpack: ops XNNPACK took.
        num_ops_outside_xnnpack: ops left on the plain TFLite kernels.
        ops_outside_xnnpack: histogram of those ops.
        notes: remarks (e.g. the Core ML platform note, class-name mismatches).
        per_layer: with ``validate(per_layer=True)``, the int8 file's layers ranked by their
            own quantization error (`keras_mvit2.export.tflite.layer_errors`:
            `LayerError.to_dict()` each, worst first), else None.
    """

    exported_path: str
    format: str
    reference: str
    num_images: int
    size_bytes: int
    reference_size_bytes: int
    quantization: str | None
    input_dtype: str | None
    output_dtype: str | None
    numeric: bool
    max_abs_diff: float | None
    mean_abs_diff: float | None
    max_abs_reference: float | None
    top1_agreement: float | None
    accuracy: float | None
    reference_accuracy: float | None
    accuracy_drop: float | None
    per_class_accuracy: dict[str, tuple[float | None, float | None]]
    op_histogram: dict[str, int]
    float_ops: dict[str, int]
    num_ops: int
    num_xnnpack_partitions: int | None
    num_ops_in_xnnpack: int | None
    num_ops_outside_xnnpack: int | None
    ops_outside_xnnpack: dict[str, int] | None
    notes: list[str]
    per_layer: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict."""
        out = dataclasses.asdict(self)
        out["per_class_accuracy"] = {
            name: {"exported": pair[0], "keras": pair[1]}
            for name, pair in self.per_class_accuracy.items()
        }
        return out


def _labels(labels: Any, num_images: int) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim == 2:
        y = np.argmax(y, axis=-1)
    if y.ndim != 1 or len(y) != num_images:
        raise ValueError(
            f"labels must be {num_images} class indices (N,) or one-hot rows (N, classes), one "
            f"per image. Received: shape {np.shape(labels)}"
        )
    if not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.equal(np.mod(y, 1), 0)):
            raise ValueError("labels must be integer class indices.")
        y = y.astype(np.int64)
    return y.astype(np.int64)


def _images(images: Any) -> np.ndarray:
    x = np.asarray(images)
    if x.ndim != 4:
        raise ValueError(
            f"images must be a batch (N, height, width, channels). Received: shape {x.shape}"
        )
    if x.dtype == np.uint8:
        return x.astype(np.float32) / 255.0
    return x.astype(np.float32)


def reference_outputs(model: keras.Model, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """The Keras model's outputs (inference mode), float32, for `validate(reference_outputs=)`."""
    x = _images(images)
    out = [
        np.asarray(model(x[i : i + batch_size], training=False), dtype=np.float32)
        for i in range(0, len(x), batch_size)
    ]
    return np.concatenate(out, axis=0)


def _accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(predictions == labels)) if len(labels) else float("nan")


def _per_class(
    exported_top1: np.ndarray | None,
    keras_top1: np.ndarray,
    labels: np.ndarray,
    class_names: Sequence[str] | None,
    num_classes: int,
) -> dict[str, tuple[float | None, float | None]]:
    names = list(class_names) if class_names else [str(i) for i in range(num_classes)]
    out: dict[str, tuple[float | None, float | None]] = {}
    for index, name in enumerate(names):
        mask = labels == index
        if not mask.any():
            continue
        exported = None if exported_top1 is None else _accuracy(exported_top1[mask], labels[mask])
        out[name] = (exported, _accuracy(keras_top1[mask], labels[mask]))
    return out


def validate(
    exported_path: str | os.PathLike,
    reference_model: keras.Model,
    images: Any,
    labels: Any,
    *,
    class_names: Sequence[str] | None = None,
    reference_outputs: np.ndarray | None = None,
    num_threads: int = 1,
    per_layer: bool = False,
    per_layer_images: int = 100,
) -> ValidationReport:
    """Compares an exported model with its Keras reference on labelled images.

    Args:
        exported_path: a `.tflite` file or a Core ML `.mlpackage`.
        reference_model: the Keras model that was exported.
        images: `(N, H, W, 3)` float in [0, 1] (the models' input) or uint8 pixels;
            real held-out images, not the calibration set.
        labels: `(N,)` class indices or `(N, classes)` one-hot.
        class_names: names in label order (per-class accuracies; checked against the
            class names in the export's metadata).
        reference_outputs: the Keras outputs for `images`, if already computed
            (`keras_mvit2.export.validate.reference_outputs`), to validate several
            exports of one model without recomputing them.
        num_threads: TFLite interpreter threads.
        per_layer: also rank the layers of a full-int8 `.tflite` by their own quantization
            error (`keras_mvit2.export.tflite.layer_errors.layer_errors_of_file`: the Keras
            model converted with the calibration the file's metadata records, measured on
            the first `per_layer_images` images); a ValueError for any other file.
        per_layer_images: images the ranking runs on (default 100).

    Returns:
        A `ValidationReport`.
    """
    path = os.fspath(exported_path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Exported model not found: {path!r}")
    x = _images(images)
    y = _labels(labels, len(x))
    expected_shape = tuple(reference_model.inputs[0].shape[1:])
    if tuple(x.shape[1:]) != expected_shape:
        raise ValueError(
            f"images have shape {tuple(x.shape[1:])} per image but the reference model takes "
            f"{expected_shape}; resize them to the model's input size."
        )
    ref = reference_outputs if reference_outputs is not None else _ref_outputs(reference_model, x)
    if len(ref) != len(x):
        raise ValueError(
            f"reference_outputs has {len(ref)} rows for {len(x)} images; compute it with "
            "reference_outputs(model, images)."
        )
    keras_top1 = np.argmax(ref, axis=-1)
    num_classes = int(ref.shape[-1])
    weights = int(sum(int(np.prod(v.shape)) for v in reference_model.weights))
    notes: list[str] = []
    ranking = None
    if per_layer:  # first: a wrong file fails before anything runs
        from keras_mvit2.export.tflite.layer_errors import layer_errors_of_file

        errors, more = layer_errors_of_file(reference_model, path, x[:per_layer_images])
        ranking = [e.to_dict() for e in errors]
        notes.extend(more)

    from keras_mvit2.export.target import target_for_path

    target = target_for_path(path)
    report = target.inspect(path)
    metadata = target.metadata(path)
    exported_names = metadata.get("class_names")
    if class_names is not None and exported_names is not None:
        if list(exported_names) != list(class_names):
            notes.append(
                "The class names in the export's metadata differ from the class names of the "
                "validation data (label order may differ)."
            )
    if class_names is None and exported_names is not None:
        class_names = exported_names
    reference_accuracy = _accuracy(keras_top1, y)
    numeric = target.can_run()
    max_diff = mean_diff = agreement = accuracy = drop = None
    top1 = None
    if numeric:
        got = target.run(path, x, num_threads=num_threads)
        if got.shape != ref.shape:
            raise ValueError(
                f"The exported model outputs {got.shape[1:]} per image but the Keras model "
                f"{ref.shape[1:]}; is it an export of this model?"
            )
        expected = ref
        if _sums_to_one(got) and not _sums_to_one(ref):  # a classifier export of logits
            expected = _softmax(ref)
            notes.append("Compared probabilities (softmax of the Keras logits).")
        diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        max_diff = float(diff.max()) if diff.size else 0.0
        mean_diff = float(diff.mean()) if diff.size else 0.0
        top1 = np.argmax(got, axis=-1)
        agreement = _accuracy(top1, keras_top1)
        accuracy = _accuracy(top1, y)
        drop = reference_accuracy - accuracy
    else:
        notes.append(target.host_note())
    float_ops = dict(getattr(report, "float_ops", None) or {})
    if float_ops and metadata.get("quantization") in ("int8",):
        notes.append(f"Float ops left in the int8 model: {float_ops}")
    return ValidationReport(
        exported_path=path,
        format=target.name,
        reference=reference_model.name,
        num_images=len(x),
        size_bytes=report.size_bytes,
        reference_size_bytes=4 * weights,
        quantization=metadata.get("quantization"),
        input_dtype=report.input_dtype,
        output_dtype=report.output_dtype,
        numeric=numeric,
        max_abs_diff=max_diff,
        mean_abs_diff=mean_diff,
        max_abs_reference=float(np.abs(ref).max()) if ref.size else 0.0,
        top1_agreement=agreement,
        accuracy=accuracy,
        reference_accuracy=reference_accuracy,
        accuracy_drop=drop,
        per_class_accuracy=_per_class(top1, keras_top1, y, class_names, num_classes),
        op_histogram=report.op_histogram,
        float_ops=float_ops,
        num_ops=report.num_ops,
        num_xnnpack_partitions=getattr(report, "num_xnnpack_partitions", None),
        num_ops_in_xnnpack=getattr(report, "num_ops_in_xnnpack", None),
        num_ops_outside_xnnpack=getattr(report, "num_ops_outside_xnnpack", None),
        ops_outside_xnnpack=getattr(report, "ops_outside_xnnpack", None),
        notes=notes,
        per_layer=ranking,
    )


_ref_outputs = reference_outputs  # `validate`'s argument of that name shadows the function


def _sums_to_one(z: np.ndarray) -> bool:
    return z.ndim == 2 and bool(np.all(z >= 0)) and np.allclose(z.sum(axis=-1), 1.0, atol=1e-3)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# --------------------------------------------------------------------------------------
# Output


def _fmt(value: Any, kind: str = "") -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100.0 * value:.2f} %"
    if kind == "pts":
        return f"{100.0 * value:+.2f} pts"
    if kind == "bytes":
        return f"{value / 1e6:.2f} MB" if value >= 1e5 else f"{value / 1e3:.1f} KB"
    if kind == "float":
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
    return str(value)


_ROWS = (
    ("format", "format", ""),
    ("quantization", "quantization", ""),
    ("I/O", None, "io"),
    ("images", "num_images", ""),
    ("size", "size_bytes", "bytes"),
    ("Keras weights (fp32)", "reference_size_bytes", "bytes"),
    ("max |diff|", "max_abs_diff", "float"),
    ("mean |diff|", "mean_abs_diff", "float"),
    ("max |Keras output|", "max_abs_reference", "float"),
    ("top-1 agreement", "top1_agreement", "pct"),
    ("accuracy", "accuracy", "pct"),
    ("Keras accuracy", "reference_accuracy", "pct"),
    ("accuracy drop", "accuracy_drop", "pts"),
    ("ops", "num_ops", ""),
    ("float ops", "float_ops", ""),
    ("XNNPACK partitions", "num_xnnpack_partitions", ""),
    ("ops in XNNPACK", "num_ops_in_xnnpack", ""),
    ("ops outside XNNPACK", "ops_outside_xnnpack", ""),
)


def format_reports(reports: Sequence[ValidationReport]) -> list[tuple[str, list[str]]]:
    """Rows ``(metric, [value per report])`` of the comparison table."""
    rows = []
    for label, field, kind in _ROWS:
        values = []
        for r in reports:
            if kind == "io":
                values.append(f"{r.input_dtype} -> {r.output_dtype}")
            elif field == "float_ops" and r.format == "coreml":
                values.append("-")
            elif field == "float_ops" and r.format == "tflite" and r.quantization in (
                "float32", "float16", "dynamic_int8"
            ):
                values.append("(float model)")
            else:
                values.append(_fmt(getattr(r, field), kind))
        rows.append((label, values))
    return rows


def print_reports(reports: Sequence[ValidationReport], console: Any = None) -> None:
    """Prints the reports side by side (one column per exported model) with rich."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="keras_mvit2 export validation (vs the Keras model)")
    table.add_column("metric")
    for r in reports:
        table.add_column(os.path.basename(r.exported_path.rstrip("/")))
    for label, values in format_reports(reports):
        table.add_row(label, *values)
    console = console or Console()
    console.print(table)
    for r in reports:
        for note in r.notes:
            console.print(f"[yellow]note[/yellow] {os.path.basename(r.exported_path)}: {note}")


def save_reports(reports: Sequence[ValidationReport], path: str | os.PathLike) -> None:
    """Writes ``{"reports": [...]}`` as JSON, atomically."""
    write_json(path, {"reports": [r.to_dict() for r in reports]})
