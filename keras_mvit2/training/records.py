"""What a run writes and returns: `run.json` (the derived setup), `config.yaml`, the saved
inference models, `metrics.json`, and the `TrainResult`."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import keras

from keras_mvit2._version import __version__
from keras_mvit2.backend import keras_backend_name
from keras_mvit2.layers.attention_registry import names_in as attention_names_in
from keras_mvit2.training.classifier import build_inference_model
from keras_mvit2.training.config import TrainConfig
from keras_mvit2.training.ema import ExponentialMovingAverage
from keras_mvit2.training.evaluation import EvalResult
from keras_mvit2.training.run_data import RunData
from keras_mvit2.training.run_folder import RunPlan, SchedulePlan
from keras_mvit2.utils.files import atomic_output, write_json


@dataclasses.dataclass
class TrainResult:
    """What `train` / `finetune` did and wrote.

    Attributes:
        history: one dict per epoch run (this call and the resumed ones): `epoch`, `loss`,
            `accuracy`, `top5`, `learning_rate` (at the end of the epoch), `step`
            (optimizer steps so far), `seconds`, `images_per_second`, and `val_*` /
            `val_ema_*` on validated epochs.
        output_dir: the run folder.
        config_path: the final config (`config.yaml`).
        checkpoint_path: the last epoch checkpoint (`.weights.h5`: model, optimizer, EMA).
        model_path: the float32 inference model with softmax (raw weights), `.keras`.
        ema_model_path: the same with the EMA weights (None without EMA).
        metrics: `{"raw": EvalResult, "ema": EvalResult}` on the validation data (empty
            without validation data).
        images_per_second: training throughput of this call's epochs (first step of each
            fit excluded: it includes tracing); for a call that trained none (a complete
            run folder), the median of the recorded epochs'.
        initial_epoch: the epoch this call started from (> 0 when it resumed).
        optimizer_step: optimizer iterations at the end.
        global_batch_size, learning_rate, num_replicas, precision: the scaled setup.
        attention: the attention layers trained (`keras_mvit2.attention.names_in`), e.g.
            `["separable"]`; also in `run.json` and `metrics.json`.
        skipped_images: unreadable images dropped from the training data.
        plan: what was done with the run folder (`run_folder.RunPlan`: new, resumed or
            complete; its `line` was printed before training).
    """

    history: list[dict[str, float]]
    output_dir: str
    config_path: str
    checkpoint_path: str | None
    model_path: str | None
    ema_model_path: str | None
    metrics: dict[str, EvalResult]
    images_per_second: float
    initial_epoch: int
    optimizer_step: int
    global_batch_size: int
    learning_rate: float
    num_replicas: int
    precision: str
    attention: list[str] = dataclasses.field(default_factory=list)
    skipped_images: int = 0
    plan: RunPlan | None = None


def make_run_info(config: TrainConfig, classifier: keras.Model, data: RunData,
                  wanted: SchedulePlan, plan: RunPlan, policy: str) -> dict[str, Any]:
    """The contents of `run.json`: the values the run derived from its config."""
    scaling = data.scaling
    return {
        "model": config.model.name,
        "attention": attention_names_in(classifier),
        "num_replicas": scaling.replicas,
        "batch_per_replica": scaling.batch_per_replica,
        "global_batch_size": scaling.global_batch,
        "reference_batch_size": scaling.reference_batch,
        "lr_factor": scaling.lr_factor,
        "peak_lr": wanted.peak_lr,
        "min_lr": wanted.min_lr,
        "warmup_init_lr": wanted.warmup_init_lr,
        "steps_per_epoch": wanted.steps_per_epoch,
        "total_steps": plan.total_steps,
        "warmup_steps": wanted.warmup_steps,
        "learning_rate": keras.saving.serialize_keras_object(plan.learning_rate),
        "multiscale_pairs": data.pairs,
        "precision": policy,
        "strategy": config.training.strategy,
        "num_classes": data.num_classes,
        "class_names": data.class_names,
        "train_examples": data.train_source.num_examples,
        "validation_examples": (None if data.val_source is None
                                else data.val_source.num_examples),
        "keras_mvit2": __version__,
        "tensorflow": _version_of("tensorflow"),
        "keras": keras.__version__,
        "backend": keras_backend_name(),
        **({} if keras_backend_name() == "tensorflow"
           else {keras_backend_name(): _version_of(keras_backend_name())}),
    }


def _version_of(module: str) -> str | None:
    """The version of `module` if this process has imported it (None otherwise: on PyTorch
    TensorFlow is never loaded)."""
    import sys

    loaded = sys.modules.get(module)
    return None if loaded is None else str(getattr(loaded, "__version__", None))


def write_run_files(config: TrainConfig, out: str, run_info: dict[str, Any]) -> None:
    """Writes `config.yaml` (the final config) and `run.json` into the run folder."""
    config.save(os.path.join(out, "config.yaml"))
    write_json(os.path.join(out, "run.json"), run_info)


def update_run_json(out: str, fields: dict[str, Any]) -> None:
    """Adds `fields` to the run folder's `run.json` (atomically; keys already there are
    replaced), for what is known only after training (weights provenance, exports)."""
    import json

    path = os.path.join(out, "run.json")
    info: dict[str, Any] = {}
    if os.path.exists(path):
        with open(path) as f:
            info = json.load(f)
    info.update(fields)
    write_json(path, info)


@dataclasses.dataclass
class InferenceModels:
    """The float32 models with softmax a run saves (raw and EMA weights) and their paths."""

    raw: keras.Model
    ema: keras.Model | None
    raw_path: str
    ema_path: str | None


def save_inference_models(config: TrainConfig, num_classes: int, classifier: keras.Model,
                          ema: ExponentialMovingAverage | None, out: str,
                          chief: bool) -> InferenceModels:
    """Builds the inference models of the trained weights; the chief saves them."""
    raw_model = build_inference_model(config, num_classes, classifier.get_weights())
    ema_model = None
    if ema is not None:
        ema_model = build_inference_model(config, num_classes, ema.averaged_values())
    model_path = os.path.join(out, "model.keras")
    ema_model_path = os.path.join(out, "model_ema.keras") if ema_model is not None else None
    if chief:
        with atomic_output(model_path) as tmp:
            raw_model.save(tmp)
        if ema_model is not None:
            with atomic_output(ema_model_path) as tmp:
                ema_model.save(tmp)
    return InferenceModels(raw_model, ema_model, model_path, ema_model_path)


def write_metrics(out: str, metrics: dict[str, EvalResult], history: list[dict],
                  images_per_second: float, skipped: int, run_info: dict[str, Any]) -> None:
    """Writes `metrics.json`: the final metrics, the history and the run's setup."""
    write_json(os.path.join(out, "metrics.json"), {
        "metrics": {k: v.to_dict() for k, v in metrics.items()},
        "history": history,
        "images_per_second": images_per_second,
        "skipped_images": skipped,
        **{k: run_info[k] for k in ("attention", "global_batch_size", "peak_lr",
                                    "precision")},
    })
