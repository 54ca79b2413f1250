"""The phone files of a fine-tuning run: export, validate and time each one.

`_export_phone_files(model, run_dir, data, ...)` is the one export step of
`keras_mvit2.ship.finetune_to_phone`: a full-integer int8 `.tflite` calibrated on training
images (float or uint8 I/O) and a float16 Core ML package, both carrying the folder's class
names and the standard metadata, each converted through its `ExportTarget`, validated on
the held-out images (`keras_mvit2.export.validate`: top-1, agreement with Keras) and timed
on this host where its runtime runs here. With `max_drop` (`--max-drop`) each
target's file is instead the optimizer's choice (`keras_mvit2.export.optimize`: the smallest
candidate within the top-1 budget, measured on the same held-out images), in the same
records.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["DEFAULT_TARGETS", "PHONE_FOLDER", "WARN_DROP_POINTS", "PhoneData",
           "_export_phone_files", "export_warnings", "file_kind"]

#: What `--export` exports by default.
DEFAULT_TARGETS = ("tflite", "coreml")
#: The phone files' folder in the run folder.
PHONE_FOLDER = "phone"
#: target name -> (file name, quantization) of the default exports.
_FILES = {"tflite": ("model_int8.tflite", "int8"), "coreml": ("model.mlpackage", "float16")}
#: Top-1 points a default file may lose against Keras on the held-out images unwarned.
WARN_DROP_POINTS = 1.0


@dataclasses.dataclass
class PhoneData:
    """The images the export step uses, at the model's input size, float32 in [0, 1].

    Attributes:
        calibration: `(n, H, W, 3)` training images (int8 calibration).
        images: `(m, H, W, 3)` held-out images (validation), or None without any.
        labels: `(m,)` int64 class indices of `images`, or None.
    """

    calibration: np.ndarray
    images: np.ndarray | None
    labels: np.ndarray | None


def _coreml_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("coremltools") is not None


def _latency(target: Any, path: str, runs: int) -> dict[str, Any] | None:
    """Host latency (batch 1, one thread) in ms, or None where the runtime is not here."""
    if not target.can_run():
        return None
    try:
        bench = target.bench(path, threads=1, runs=runs, warmup=max(1, runs // 10),
                             measure_memory=False)
    except NotImplementedError:
        return None
    stats = bench.latency_ms
    return {"median_ms": float(stats.median),
            "p90_ms": None if stats.p90 is None else float(stats.p90),
            "threads": 1, "runtime": target.runtime, "runs": runs,
            "cpu": bench.device.get("cpu") or bench.device.get("machine")}


def _export_phone_files(
    model: Any,
    run_dir: str | os.PathLike,
    data: PhoneData,
    *,
    class_names: Sequence[str],
    targets: Sequence[str] = DEFAULT_TARGETS,
    io_dtype: str = "float32",
    bench_runs: int = 50,
    max_drop: float | None = None,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Exports `model` for phones into `run_dir/phone/`, validates and times each file.

    Args:
        model: the Keras inference model (fixed input size, softmax).
        run_dir: the run folder.
        data: calibration and held-out images (`PhoneData`).
        class_names: written into each file, in label order.
        targets: export target names (`"tflite"`, `"coreml"`); Core ML is skipped, with a
            note, where coremltools is not installed.
        io_dtype: the int8 `.tflite`'s input / output type: `"float32"` (pixels / 255 in,
            probabilities out) or `"uint8"` (camera pixels in).
        bench_runs: timed runs of the host latency measurement.
        max_drop: ship, per target, the smallest file whose top-1 drop against Keras on
            the held-out images is at most this many points (`keras_mvit2.export.optimize`;
            every candidate and `report.json` in `phone/optimize_<target>/`) instead of
            the default int8 / fp16 files. A target with no candidate within the budget
            gets no file and a record whose `note` starts with "over budget".
        log: called with one line per step.

    Returns:
        One record per target: `target`, `format`, `path` (relative to `run_dir`),
        `quantization`, `io_dtype`, `size_bytes`, `num_ops`, `validation`
        (`ValidationReport.to_dict()` of the held-out images, None without any),
        `top1`, `keras_top1`, `top1_agreement` (None where not run), `latency`
        (`median_ms`, `p90_ms`, ... or None), `note`; with `max_drop`, also `recipe` and
        `optimizer_report`.
    """
    from keras_mvit2.export import get_target, validate
    from keras_mvit2.export.validate import reference_outputs

    log = log or (lambda line: None)
    if max_drop is not None and (data.images is None or not len(data.images)):
        raise ValueError("--max-drop measures every candidate on held-out images; give "
                         "some (--val DIR or a fraction above 0).")
    run_dir = os.path.abspath(os.fspath(run_dir))
    folder = os.path.join(run_dir, PHONE_FOLDER)
    os.makedirs(folder, exist_ok=True)
    reference = None
    if data.images is not None and len(data.images):
        reference = reference_outputs(model, data.images)
    records = []
    for name in targets:
        target = get_target(name)
        filename, quantization = _FILES[name]
        path = os.path.join(folder, filename)
        record: dict[str, Any] = {"target": name, "format": target.display_name,
                                  "path": os.path.relpath(path, run_dir),
                                  "quantization": quantization, "note": None}
        if name == "coreml" and not _coreml_installed():
            record.update(path=None, note="skipped: pip install 'keras_mvit2[coreml]'")
            records.append(record)
            continue
        if max_drop is None:
            log(f"exporting {target.display_name} ({quantization})")
            options: dict[str, Any] = {}
            if name == "tflite":
                options = {"calibration_data": data.calibration, "io_dtype": io_dtype,
                           "num_calibration_samples": len(data.calibration)}
                record["io_dtype"] = io_dtype
            report = target.convert(model, path, quantization=quantization,
                                    class_names=list(class_names), **options)
        else:
            path = _optimized(model, folder, name, data, class_names, max_drop, record, log)
            if path is None:
                records.append(record)
                continue
            report = target.inspect(path)
        record.update(size_bytes=int(report.size_bytes), num_ops=int(report.num_ops))
        record.update(validation=None, top1=None, keras_top1=None, top1_agreement=None)
        if reference is not None:
            log(f"validating {target.display_name} on {len(data.images)} held-out images")
            checked = validate(path, model, data.images, data.labels,
                               class_names=list(class_names), reference_outputs=reference)
            record.update(validation=checked.to_dict(), top1=checked.accuracy,
                          keras_top1=checked.reference_accuracy,
                          top1_agreement=checked.top1_agreement)
            if not checked.numeric:
                record["note"] = target.host_note()
        record["latency"] = _latency(target, path, bench_runs)
        records.append(record)
    return records


def file_kind(record: dict[str, Any]) -> str:
    """A phone file's format and kind, as every summary names it: `"TFLite int8"`."""
    return f"{record['format']} {record['quantization']}"


def export_warnings(records: Sequence[dict[str, Any]]) -> list[str]:
    """One warning per default file (not an optimizer choice, which is within its budget)
    whose top-1 on the held-out images is more than `WARN_DROP_POINTS` below the Keras
    model's, naming the fix; `records` as `_export_phone_files` returns them."""
    messages = []
    for record in records:
        if "optimizer_report" in record or record.get("top1") is None \
                or record.get("keras_top1") is None:
            continue
        drop = round(100 * (record["keras_top1"] - record["top1"]), 6)  # 0.70 - 0.69: 1.0
        if drop > WARN_DROP_POINTS:
            messages.append(
                f"the {file_kind(record)} file ({record['path']}) "
                f"scores {drop:.1f} top-1 points below the Keras model on the held-out "
                f"images (they agree on {100 * record['top1_agreement']:.1f} % of them). "
                "Before shipping it, run again with --max-drop 1 (Python: max_drop=1) to "
                "get the smallest file within 1 point, or export a float16 file.")
    return messages


def _optimized(model: Any, folder: str, name: str, data: PhoneData,
               class_names: Sequence[str], max_drop: float, record: dict[str, Any],
               log: Callable[[str], None]) -> str | None:
    """The optimizer's best file for target `name` (its path), or None over budget (the
    record then says so)."""
    from keras_mvit2.export.optimizer import OptimizeData, OverBudgetError, optimize

    out = os.path.join(folder, f"optimize_{name}")
    log(f"optimizing {name} within {max_drop:g} top-1 points on {len(data.images)} "
        "held-out images")
    held_out = OptimizeData(data.calibration, data.images, data.labels, list(class_names),
                            "the run's held-out images")
    record["optimizer_report"] = os.path.relpath(os.path.join(out, "report.json"),
                                                 os.path.dirname(folder))
    try:
        result = optimize(model, out, target=name, data=held_out, max_drop=max_drop,
                          class_names=list(class_names), verbose=False)
    except OverBudgetError as err:
        record.update(path=None, note=f"over budget: {err}")
        return None
    record.update(path=os.path.relpath(result.best_path, os.path.dirname(folder)),
                  quantization=result.best.name, recipe=result.best.recipe)
    return result.best_path
