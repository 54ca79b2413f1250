"""The phone files of a fine-tuning run: export, validate and time each one.

`_export_phone_files(model, run_dir, data, ...)` is the one export step of
`keras_mvit2.ship.finetune_to_phone`: a full-integer int8 `.tflite` calibrated on training
images (float or uint8 I/O) and a float16 Core ML package, both carrying the folder's class
names and the standard metadata, each converted through its `ExportTarget`, validated on
the held-out images (`keras_mvit2.export.validate`: top-1, agreement with Keras) and timed
on this host where its runtime runs here. With `max_drop` (`--max-drop`) each
target's file is instead the optimizer's choice (`keras_mvit2.optimizer.optimize` with its
default objective: the smallest candidate within the top-1 budget, measured on the same
held-out images, that is not slower than float32 on this host), in the same records.

Quantization-aware training (`qat`): where the default int8 `.tflite` agrees with Keras on
fewer than `QAT_BELOW_AGREEMENT` of the held-out images, the ``qat_int8`` file (the
optimizer's candidate, trained on the run's own training images less a quarter set aside)
is built. `keras_mvit2.quantize.qat` judges it against the post-training file on images
neither file trained or calibrated on (the held-out images and the set-aside training
images): it ships only where McNemar's exact one-sided test on the images where the two
files disagree gives p < 0.05 that it agrees with Keras more often and its top-1 there is not
lower. The export step then re-measures it on the held-out images and keeps the
post-training file wherever the QAT file's top-1 or agreement there is lower (the guard);
only then does it replace the default file (the post-training file is kept as
`POST_TRAINING_FILE`). With `max_drop` the optimizer offers ``qat_int8`` when no
post-training int8 file meets the budget.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_TARGETS",
    "PHONE_FOLDER",
    "POST_TRAINING_FILE",
    "QAT_BELOW_AGREEMENT",
    "QAT_FILE",
    "QAT_NOT_SHIPPED",
    "WARN_DROP_POINTS",
    "PhoneData",
    "_export_phone_files",
    "drop_points",
    "export_warnings",
    "file_kind",
    "judged_in_words",
]

#: What `--export` exports by default.
DEFAULT_TARGETS = ("tflite", "coreml")
#: The phone files' folder in the run folder.
PHONE_FOLDER = "phone"
#: target name -> (file name, quantization) of the default exports.
_FILES = {"tflite": ("model_int8.tflite", "int8"), "coreml": ("model.mlpackage", "float16")}
#: Top-1 points a default file may lose against Keras on the held-out images unwarned.
WARN_DROP_POINTS = 1.0
#: Quantization-aware training is tried where the post-training int8 file agrees with Keras
#: on fewer of the held-out images than this.
QAT_BELOW_AGREEMENT = 0.99
#: The quantization-aware-trained int8 file while it is measured, and where the
#: post-training file goes when the trained one replaces the default file.
QAT_FILE = "model_qat_int8.tflite"
POST_TRAINING_FILE = "model_int8_post_training.tflite"
#: Where a quantization-aware-trained file that does not replace the default file is kept
#: (relative to the run folder: not a phone file; for inspection and
#: ``benchmarks/finetune_int8_check.py``).
QAT_NOT_SHIPPED = os.path.join("eval", "model_qat_int8_not_shipped.tflite")


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


def _latency(target: Any, path: str, runs: int) -> dict[str, Any] | None:
    """Host latency (batch 1, one thread) in ms, or None where the runtime is not here."""
    if not target.can_run():
        return None
    from keras_mvit2.latency.host import bench_file

    try:
        bench = bench_file(path, target=target, threads=1, runs=runs,
                           warmup=max(1, runs // 10), measure_memory=False)
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
    qat: Any = None,
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
            the held-out images is at most this many points (`keras_mvit2.optimizer.optimize`;
            every candidate and `report.json` in `phone/optimize_<target>/`) instead of
            the default int8 / fp16 files. A target with no candidate within the budget
            gets no file and a record whose `note` starts with "over budget".
        qat: the run's training images and QAT schedule
            (`keras_mvit2.optimizer.QATSettings`) for the ``qat_int8`` file: tried
            where the default int8 `.tflite` agrees with Keras on fewer than
            `QAT_BELOW_AGREEMENT` of the held-out images (see the module docstring), and
            offered to the optimizer with `max_drop`; None: never.
        log: called with one line per step.

    Returns:
        One record per target: `target`, `format`, `path` (relative to `run_dir`),
        `quantization`, `io_dtype`, `size_bytes`, `num_ops`, `validation`
        (`ValidationReport.to_dict()` of the held-out images, None without any),
        `top1`, `keras_top1`, `top1_agreement` (None where not run), `latency`
        (`median_ms`, `p90_ms`, ... or None), `note`; with `max_drop`, also `recipe` and
        `optimizer_report`; where QAT was tried, `qat` (its settings and figures,
        `shipped`, the post-training file's figures, or the `error` that stopped it).
    """
    from keras_mvit2.demo import coreml_available
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
        if name == "coreml" and not coreml_available():
            record.update(path=None, note="skipped: pip install 'keras_mvit2[coreml]'")
            records.append(record)
            continue
        if max_drop is None:
            log(f"exporting {target.display_name} ({quantization})")
            if name == "tflite":  # an earlier call's QAT files would be taken for this one's
                from keras_mvit2.optimizer.tflite_candidates import trained_file

                for stale in (os.path.join(folder, QAT_FILE),
                              trained_file(os.path.join(folder, QAT_FILE)),
                              os.path.join(folder, POST_TRAINING_FILE),
                              os.path.join(run_dir, QAT_NOT_SHIPPED)):
                    if os.path.exists(stale):
                        os.remove(stale)
            options: dict[str, Any] = {}
            if name == "tflite":
                options = {"calibration_data": data.calibration, "io_dtype": io_dtype,
                           "num_calibration_samples": len(data.calibration)}
                record["io_dtype"] = io_dtype
            report = target.convert(model, path, quantization=quantization,
                                    class_names=list(class_names), **options)
        else:
            path = _optimized(model, folder, name, data, class_names, max_drop, record, log,
                              qat)
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
            # (A top-1 drop over a point is an agreement below 99 % too.)
            if max_drop is None and name == "tflite" and qat is not None and (
                    record["top1_agreement"] < QAT_BELOW_AGREEMENT):
                _try_qat(model, target, path, record, data, class_names, io_dtype,
                         reference, qat, log)
        record["latency"] = _latency(target, path, bench_runs)
        records.append(record)
    return records


def file_kind(record: dict[str, Any]) -> str:
    """A phone file's format and kind, as every summary names it: `"TFLite int8"`."""
    return f"{record['format']} {record['quantization']}"


def drop_points(record: dict[str, Any]) -> float | None:
    """A phone file's top-1 drop against Keras on the held-out images, in points (rounded
    to 6 decimals: 0.70 - 0.69 is 1.0), or None where not measured."""
    if record.get("top1") is None or record.get("keras_top1") is None:
        return None
    return round(100 * (record["keras_top1"] - record["top1"]), 6)


def export_warnings(records: Sequence[dict[str, Any]]) -> list[str]:
    """One warning per default file (not an optimizer choice, which is within its budget)
    whose top-1 on the held-out images is more than `WARN_DROP_POINTS` below the Keras
    model's, naming the fix (and what quantization-aware training gave, where it was tried
    and did not fix it); `records` as `_export_phone_files` returns them."""
    messages = []
    for record in records:
        drop = drop_points(record)
        if "optimizer_report" in record or drop is None:
            continue
        if drop > WARN_DROP_POINTS:
            messages.append(
                f"the {file_kind(record)} file ({record['path']}) "
                f"scores {drop:.1f} top-1 points below the Keras model on the held-out "
                f"images (they agree on {100 * record['top1_agreement']:.1f} % of them). "
                f"{_qat_outcome(record.get('qat'))}"
                "Before shipping it, run again with --max-drop 1 (Python: max_drop=1) to "
                "get the smallest file within 1 point, or export a float16 file.")
    return messages


def judged_in_words(facts: dict[str, Any]) -> str:
    """The QAT choice's figures as one clause: the judge images, both agreements and the
    paired test's p-value."""
    return (f"agreement with Keras on {facts['num_judged']} images neither file trained or "
            f"calibrated on ({facts['judged_on']}): post-training "
            f"{100 * facts['agreement_post_training']:.1f} %, quantization-aware-trained "
            f"{100 * facts['agreement_qat']:.1f} %, paired test p = {facts['p_value']:.2g}")


def _qat_outcome(facts: dict[str, Any] | None) -> str:
    """What the quantization-aware training tried for a warned file gave, as a sentence."""
    if not facts:
        return ""
    if facts.get("error"):
        return f"Quantization-aware training was tried and failed ({facts['error'][:200]}). "
    judged = judged_in_words(facts)
    if facts.get("shipped") == "qat":  # chosen over the post-training file, still warned
        before = facts["post_training"]
        return (f"It is quantization-aware trained ({facts.get('steps')} steps), which did "
                f"not fix it; the paired test chose it over the post-training file "
                f"({before['path']}, {_against_keras(before['drop_points'])}; {judged}). ")
    return (f"Quantization-aware training ({facts.get('steps')} steps) was not shipped: "
            f"{facts.get('guard') or facts.get('reason')} ({judged}). ")


def _try_qat(model: Any, target: Any, path: str, record: dict[str, Any], data: PhoneData,
             class_names: Sequence[str], io_dtype: str, reference: np.ndarray,
             qat: Any, log: Callable[[str], None]) -> None:
    """Builds the ``qat_int8`` file for the default int8 file at `path` (`record`); where
    `keras_mvit2.quantize.qat` ships it (the paired test chose it) and its top-1 and
    agreement on the held-out images are not below the post-training file's (the guard) it
    becomes the file at `path`, validated, and `record` its figures. `record["qat"]` says
    what happened."""
    from keras_mvit2.export import validate
    from keras_mvit2.optimizer.qat_settings import QAT_CANDIDATE
    from keras_mvit2.optimizer.targets import qat_candidate_of

    folder = os.path.dirname(path)
    run_dir = os.path.dirname(folder)
    before = drop_points(record)
    qat_path = os.path.join(folder, QAT_FILE)
    log(f"the post-training int8 file agrees with Keras on "
        f"{100 * record['top1_agreement']:.1f} % of the held-out images and scores "
        f"{_against_keras(before)}: quantization-aware training on the run's training images "
        f"({qat.epochs} pass(es) of at most {qat.max_steps} steps of {qat.batch_size}, "
        f"learning rate {qat.learning_rate:g}, towards the Keras model's own answers)")
    facts: dict[str, Any] = {**qat.describe(), "post_training": {
        "top1": record["top1"], "top1_agreement": record["top1_agreement"],
        "drop_points": before, "size_bytes": record["size_bytes"]}}
    record["qat"] = facts
    try:
        candidate = qat_candidate_of(target, model, qat, calibration_data=data.calibration,
                                     class_names=list(class_names), io_dtype=io_dtype,
                                     held_out=(data.images, data.labels))
        facts.update(candidate.build(qat_path) or {})
    except Exception as err:  # the training or the converter: reported, never fatal
        facts["error"] = f"{type(err).__name__}: {err}"
        log(f"quantization-aware training failed: {facts['error'].splitlines()[0][:200]}")
        return
    judged = judged_in_words(facts)
    trained = facts.pop("trained_path", None)  # the trained file, whichever was chosen
    if facts["shipped"] != "qat":
        os.remove(qat_path)  # the build wrote the post-training file there
        _keep_not_shipped(trained, run_dir, facts)
        log(f"{judged}: the post-training file stays ({facts.get('reason')})")
        return
    checked = validate(qat_path, model, data.images, data.labels,
                       class_names=list(class_names), reference_outputs=reference)
    guard = _guard(checked, record)
    if guard is not None:  # never a default file that does worse on the held-out images
        os.remove(qat_path)
        _keep_not_shipped(trained, run_dir, facts)
        facts.update(shipped="post_training", guard=guard)
        log(f"{judged}; the post-training file stays: {guard}")
        return
    if trained is not None and os.path.exists(trained):
        os.remove(trained)  # the file shipped
    after = round(100 * (checked.reference_accuracy - checked.accuracy), 6)
    facts.update(top1=checked.accuracy, top1_agreement=checked.top1_agreement,
                 drop_points=after)
    kept = os.path.join(folder, POST_TRAINING_FILE)
    os.replace(path, kept)  # both renames are atomic: each file is whole or absent
    os.replace(qat_path, path)
    facts["post_training"]["path"] = os.path.relpath(kept, run_dir)
    report = target.inspect(path)
    record.update(size_bytes=int(report.size_bytes), num_ops=int(report.num_ops),
                  validation=checked.to_dict(), top1=checked.accuracy,
                  keras_top1=checked.reference_accuracy,
                  top1_agreement=checked.top1_agreement)
    record["note"] = (
        f"The {file_kind(record)} file ({record['path']}) is quantization-aware trained "
        f"({QAT_CANDIDATE}: {facts.get('steps')} steps on "
        f"{facts.get('training_images')} training images, learning rate "
        f"{qat.learning_rate:g}); {judged} (the post-training file is kept as "
        f"{facts['post_training']['path']}).")
    log(f"shipping the quantization-aware-trained int8 file as {record['path']}: {judged}")


def _keep_not_shipped(trained: str | None, run_dir: str, facts: dict[str, Any]) -> None:
    """Moves the quantization-aware-trained file that was not shipped to `QAT_NOT_SHIPPED`
    (out of `phone/`) and records where."""
    if trained is None or not os.path.exists(trained):
        return
    kept = os.path.join(run_dir, QAT_NOT_SHIPPED)
    os.makedirs(os.path.dirname(kept), exist_ok=True)
    os.replace(trained, kept)
    facts["not_shipped_path"] = QAT_NOT_SHIPPED


def _guard(checked: Any, record: dict[str, Any]) -> str | None:
    """Why the QAT file (`checked`: its validation on the held-out images) must not replace
    the post-training file of `record`, or None: its top-1 or its agreement with Keras on
    the held-out images is below the post-training file's."""
    n = checked.num_images
    if checked.accuracy < record["top1"]:
        return (f"the quantization-aware-trained file's top-1 on the {n} held-out images is "
                f"lower ({100 * checked.accuracy:.1f} against {100 * record['top1']:.1f} %)")
    if checked.top1_agreement < record["top1_agreement"]:
        return (f"the quantization-aware-trained file agrees with Keras on fewer of the {n} "
                f"held-out images ({100 * checked.top1_agreement:.1f} against "
                f"{100 * record['top1_agreement']:.1f} %)")
    return None


def _against_keras(drop: float) -> str:
    """A top-1 drop in words: ``"7.0 top-1 points below Keras"``, ``"1.3 points above"``."""
    if abs(drop) < 0.05:
        return "the Keras model's top-1"
    return f"{abs(drop):.1f} top-1 points {'below' if drop > 0 else 'above'} Keras"


def _optimized(model: Any, folder: str, name: str, data: PhoneData,
               class_names: Sequence[str], max_drop: float, record: dict[str, Any],
               log: Callable[[str], None], qat: Any = None) -> str | None:
    """The optimizer's best file for target `name` (its path), or None over budget (the
    record then says so)."""
    from keras_mvit2.optimizer import OptimizeData, OverBudgetError, optimize

    out = os.path.join(folder, f"optimize_{name}")
    log(f"optimizing {name} within {max_drop:g} top-1 points on {len(data.images)} "
        "held-out images")
    held_out = OptimizeData(data.calibration, data.images, data.labels, list(class_names),
                            "the run's held-out images")
    record["optimizer_report"] = os.path.relpath(os.path.join(out, "report.json"),
                                                 os.path.dirname(folder))
    try:
        result = optimize(model, out, target=name, data=held_out, max_drop=max_drop,
                          class_names=list(class_names), qat=qat, verbose=False)
    except OverBudgetError as err:
        record.update(path=None, note=f"over budget: {err}")
        return None
    record.update(path=os.path.relpath(result.best_path, os.path.dirname(folder)),
                  quantization=result.best.name, recipe=result.best.recipe)
    return result.best_path
