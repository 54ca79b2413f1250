"""From a folder of photos to labelled phone models: `finetune_to_phone` (`mvit2 finetune`).

The steps, each the library's own function:

1. data      `check_training_data`: the classes and their counts per split (printed before
             training), warnings for tiny or imbalanced classes, one clear error for data
             that cannot work;
2. weights   `keras_mvit2.models.weights_source.resolve_weights_source` (a tag, a KerasHub
             preset, an `hf://` id, a file, or none), downloaded once and cached;
3. train     `keras_mvit2.training.finetune` (the run folder: resume, refuse, start over);
4. evaluate  the shipped model (EMA weights where the recipe keeps an EMA) on the held-out
             images: top-1 / top-5, per class, confusion matrix (`eval/`);
5. export    `keras_mvit2.ship.phone_files._export_phone_files`: int8 `.tflite` and Core
             ML fp16 in `phone/`, validated and timed; an int8 `.tflite` that agrees with
             Keras on fewer than 99 % of the held-out images gets a short quantization-
             aware training on the run's training images, less a quarter set aside, and
             is replaced by its file only where an exact paired test on the held-out and
             set-aside images chooses it (p < 0.05) and its top-1 and agreement on the
             held-out images are not lower (said in the output and the card, with the
             p-value); a warning (printed and in the card's limits) for a file that loses
             more than a point of top-1;
6. describe  `run.json` gains `data`, `recipe`, `evaluation`, `exports`, `created`,
             `limits`; `MODEL_CARD.md` is written from `run.json`
             (`keras_mvit2.ship.model_card`).

```python
from keras_mvit2 import training
from keras_mvit2.ship import finetune_to_phone

config = training.load_config("finetune_small_data", [
    "data.train=photos", "model.name=mobilevitv2_050", "output.dir=run"])
result = finetune_to_phone(config, "imagenet")
print(result.paths["tflite"], result.paths["model_card"])
```
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from keras_mvit2.demo import DemoStep
from keras_mvit2.ship.data_check import DataCheck, check_training_data
from keras_mvit2.ship.model_card import _mb, _pct, write_model_card
from keras_mvit2.ship.phone_files import (
    DEFAULT_TARGETS,
    export_warnings,
    file_kind,
)

__all__ = ["KNOWN_LIMITS", "ShipResult", "finetune_to_phone"]

Log = Callable[[str], None]

#: The known limits every card states (the data-specific ones are added per run).
KNOWN_LIMITS = (
    "Trained on the photos of one folder: expect lower accuracy on images unlike them "
    "(other cameras, lighting, backgrounds, framing) and no meaningful answer for objects "
    "of none of its classes (the model always picks one of them).",
    "The accuracy figures come from the held-out images of that folder; with few images "
    "per class they are uncertain by several points.",
    "The TFLite file's agreement with the Keras model is measured on the same held-out images; "
    "Core ML predictions can only be checked on macOS.",
    "Latencies were measured on the machine that trained the model (host CPU, LiteRT), not "
    "on a phone.",
)


@dataclasses.dataclass
class ShipResult:
    """What `finetune_to_phone` trained, measured and wrote.

    Attributes:
        run_dir: the run folder (absolute).
        data: the `DataCheck` (classes, counts, warnings).
        train: the `TrainResult` of `training.finetune`.
        evaluation: the shipped model's `EvalResult` on the held-out images (None without).
        exports: the records of `_export_phone_files`.
        paths: `model`, `tflite`, `coreml`, `confusion_matrix`, `model_card`, `run_json`
            -> absolute path (None when not written).
        steps: the summary rows (`keras_mvit2.demo.DemoStep`, as `mvit2 demo` prints).
        seconds: wall time of the whole call.
    """

    run_dir: str
    data: DataCheck
    train: Any
    evaluation: Any
    exports: list[dict[str, Any]]
    paths: dict[str, str | None]
    steps: list[DemoStep]
    seconds: float


def _recipe(config: Any, train: Any, freeze_backbone: bool) -> dict[str, Any]:
    augment = dataclasses.asdict(config.augment) if dataclasses.is_dataclass(
        config.augment) else dict(config.augment)
    return {
        "model": config.model.name, "image_size": config.model.image_size,
        "epochs": config.training.epochs, "optimizer": config.optimizer.name,
        "peak_lr": train.learning_rate, "weight_decay": config.optimizer.weight_decay,
        "global_batch_size": train.global_batch_size, "schedule": config.schedule.name,
        "warmup_epochs": config.schedule.warmup_epochs,
        "label_smoothing": config.training.label_smoothing,
        "ema": config.ema.enabled, "freeze_backbone": freeze_backbone,
        "augmentation": augment, "precision": train.precision,
        "images_per_second": (float(train.images_per_second)
                              if math.isfinite(train.images_per_second) else None),
    }


def finetune_to_phone(
    config: Any,
    weights: Any = "imagenet",
    *,
    freeze_backbone: bool = False,
    export: Sequence[str] = DEFAULT_TARGETS,
    io_dtype: str = "float32",
    num_calibration_samples: int = 200,
    bench_runs: int = 50,
    max_drop: float | None = None,
    qat_steps: int | None = None,
    qat_learning_rate: float | None = None,
    qat_epochs: int | None = None,
    replan: bool = False,
    log: Log | None = None,
    on_plan: Callable[[Any], None] | None = None,
) -> ShipResult:
    """Fine-tunes on a folder of photos and writes labelled phone files and a model card.

    Args:
        config: a `TrainConfig` whose data is an image folder (the packaged
            `finetune_small_data` recipe, say, with `data.train` set).
        weights: what `training.finetune` takes: a tag (`"imagenet"`), a KerasHub preset
            name, an `hf://` id, a file, None / `"none"`, or a resolved `WeightsSource`.
        freeze_backbone: train only the classifier.
        export: target names (`"tflite"`, `"coreml"`), or empty for none.
        io_dtype: the int8 `.tflite`'s I/O type, `"float32"` or `"uint8"`.
        num_calibration_samples: training images that calibrate the int8 file.
        bench_runs: timed runs of each host latency measurement.
        max_drop: ship per target the optimizer's smallest file within this top-1 drop
            (points, on the held-out images) instead of int8 / fp16
            (`keras_mvit2.ship.phone_files._export_phone_files`; its default objective:
            nothing slower than float32 on this host).
        qat_steps: the quantization-aware training of the ``qat_int8`` file (tried where
            the int8 `.tflite` agrees with Keras on fewer than `QAT_BELOW_AGREEMENT` of the
            held-out images, and offered to the optimizer with `max_drop`), towards the
            model's own answers on the run's training images: at most this many steps a
            pass (default `keras_mvit2.optimizer.QAT_MAX_STEPS`; 0: never).
        qat_learning_rate: its Adam learning rate (default `QAT_LEARNING_RATE`).
        qat_epochs: its passes over the training images (default `QAT_EPOCHS`).
        replan: as `training.train`.
        log: called with progress lines and the warnings: small or imbalanced classes,
            and default files that lose more than `WARN_DROP_POINTS` top-1 points
            against Keras (default: the warnings go to `warnings.warn`, nothing else is
            said). The warnings are also the card's last limits.
        on_plan: as `training.train`.

    Returns:
        A `ShipResult`; the run folder holds `model.keras` / `model_ema.keras`,
        `eval/`, `phone/`, `run.json` and `MODEL_CARD.md`.
    """
    from keras_mvit2 import training
    from keras_mvit2._version import __version__
    from keras_mvit2.models.weights_source import WeightsSource, resolve_weights_source
    from keras_mvit2.optimizer.qat_settings import (
        QAT_EPOCHS,
        QAT_LEARNING_RATE,
        QAT_MAX_STEPS,
        qat_settings,
    )
    from keras_mvit2.ship.export_step import ExportOptions, export_run_files
    from keras_mvit2.training.records import update_run_json

    if io_dtype not in ("float32", "uint8"):
        raise ValueError(f"io_dtype must be 'float32' or 'uint8'. Received: {io_dtype!r}")
    start = time.monotonic()
    say = log or (lambda line: None)
    steps: list[DemoStep] = []

    checked, train_source, _ = check_training_data(config)
    options = ExportOptions(
        tuple(export), io_dtype, num_calibration_samples, bench_runs, max_drop,
        QAT_MAX_STEPS if qat_steps is None else qat_steps,
        QAT_LEARNING_RATE if qat_learning_rate is None else qat_learning_rate,
        QAT_EPOCHS if qat_epochs is None else qat_epochs)
    qat_settings(train_source, steps=options.qat_steps,  # checked before training
                 learning_rate=options.qat_learning_rate, epochs=options.qat_epochs)
    say(f"{len(checked.class_names)} classes:")
    for line in checked.lines():
        say(line)

    def warn(message: str) -> None:
        if log is None:
            warnings.warn(message, stacklevel=3)
        else:
            log(f"warning: {message}")

    for message in checked.warnings:
        warn(message)

    t = time.monotonic()
    source = weights if isinstance(weights, WeightsSource) else resolve_weights_source(
        weights, config.model.name)
    say(f"starting from {_describe_source(source)}")
    result = training.finetune(config, source, freeze_backbone=freeze_backbone,
                               replan=replan, on_plan=on_plan)
    run_dir = result.output_dir
    steps.append(DemoStep(
        "train", f"{sum(checked.counts['train'])} images x {config.training.epochs} epochs "
        f"at {config.model.image_size}x{config.model.image_size} from "
        f"{_describe_source(source)}, {_speed_text(result)}",
        result.ema_model_path or result.model_path, time.monotonic() - t))

    shipped = result.ema_model_path or result.model_path
    evaluation = result.metrics.get("ema") or result.metrics.get("raw")
    paths: dict[str, str | None] = {"model": shipped, "tflite": None, "coreml": None,
                                    "confusion_matrix": None,
                                    "run_json": os.path.join(run_dir, "run.json")}
    eval_facts = None
    if evaluation is not None:
        report = training.write_eval_report(evaluation, os.path.join(run_dir, "eval"), info={
            "model": os.path.basename(shipped), "data": "held-out images"})
        paths["confusion_matrix"] = report["confusion_matrix"]
        eval_facts = {**evaluation.to_dict(), "model": os.path.basename(shipped),
                      "confusion_matrix_image": os.path.relpath(report["confusion_matrix"],
                                                                run_dir)}
        steps.append(DemoStep(
            "evaluate", f"top-1 {_pct(evaluation.top1)}, top-5 {_pct(evaluation.top5)} on "
            f"{evaluation.num_examples} held-out images", report["confusion_matrix"], 0.0))
    else:
        steps.append(DemoStep("evaluate", "no held-out images (--val 0): not measured",
                              None, 0.0))

    records: list[dict[str, Any]] = []
    if export:
        t = time.monotonic()
        records = export_run_files(config, shipped, run_dir, options, log=log)
        per_file = (time.monotonic() - t) / max(1, len(records))
        for record in records:
            if record["path"] is not None:
                paths[record["target"]] = os.path.join(run_dir, record["path"])
            steps.append(_export_step(record, run_dir, per_file))
    export_problems = export_warnings(records)
    for message in export_problems:
        warn(message)

    facts = {
        "data": {"train": config.data.train, "validation": config.data.validation,
                 "validation_fraction": config.data.validation_fraction,
                 "class_names": checked.class_names, "per_class": checked.per_class(),
                 "warnings": checked.warnings},
        "recipe": _recipe(config, result, freeze_backbone),
        "evaluation": eval_facts,
        "exports": records,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "keras_mvit2": __version__,
        "limits": [*KNOWN_LIMITS, *_data_limits(checked, source), *export_problems],
    }
    if result.model_path is not None:  # the chief writes the run folder
        update_run_json(run_dir, facts)
        paths["model_card"] = write_model_card(run_dir)
        steps.append(DemoStep("model card", "classes, weights and licence, recipe, "
                              "figures, limits", paths["model_card"], 0.0))
    return ShipResult(run_dir=run_dir, data=checked, train=result, evaluation=evaluation,
                      exports=records, paths=paths, steps=steps,
                      seconds=time.monotonic() - start)


def _speed_text(train: Any) -> str:
    if not math.isfinite(train.images_per_second):
        return "speed not recorded"
    complete = train.plan is not None and train.plan.action == "complete"
    return f"{train.images_per_second:.1f} images/s{' (trained earlier)' if complete else ''}"


def _describe_source(source: Any) -> str:
    if source.kind == "random":
        return "random initialization"
    if source.kind == "file":
        return f"the file {os.path.basename(source.value)}"
    what = source.tag or source.value
    return f"{what} ({source.repo_id})" if source.repo_id else str(what)


def _data_limits(checked: DataCheck, source: Any) -> list[str]:
    limits = list(checked.warnings)
    if source.kind == "random":
        limits.append("Trained from random initialization, not from pretrained weights: "
                      "expect far lower accuracy than a fine-tuned checkpoint.")
    return limits


def _export_step(record: dict[str, Any], run_dir: str, seconds: float) -> DemoStep:
    name = file_kind(record)
    if record["path"] is None:
        return DemoStep(name, record["note"] or "skipped", None, 0.0)
    parts = [_mb(record.get("size_bytes"))]
    if record.get("top1_agreement") is not None:
        parts.append(f"top-1 {_pct(record['top1'])}, agrees with Keras on "
                     f"{_pct(record['top1_agreement'])}")
    elif record.get("note"):
        parts.append("structure checked (predictions need macOS)")
    latency = record.get("latency")
    if latency:
        parts.append(f"{latency['median_ms']:.2f} ms on this host")
    if (record.get("qat") or {}).get("shipped") == "qat":  # else "post_training"
        parts.append("quantization-aware trained (the post-training file agrees with Keras "
                     f"on {_pct(record['qat']['post_training']['top1_agreement'])})")
    return DemoStep(name, ", ".join(parts), os.path.join(run_dir, record["path"]), seconds)
