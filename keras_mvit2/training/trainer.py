"""Training, fine-tuning and evaluation of keras_mvit2 classifiers with the paper's recipe.

`train(config)` runs a whole experiment from a `TrainConfig`:

- model: `create_model(config.model.name, classifier_activation=None)` (logits; the
  saved inference models get the same architecture with `classifier_activation="softmax"`
  and the trained weights), optionally started from pretrained weights with a new head;
- data: `keras_mvit2.data` pipelines (epoch `e` uses seed `data.seed + e`, so an epoch's
  batches do not depend on how the run got there: a resumed run sees the same data);
- recipe: AdamW (or SGD) with decoupled weight decay except on 1-D weights, linear
  warm-up + cosine learning rate (`WarmupCosineDecay`), label-smoothing cross-entropy on
  (soft) labels, clipping of the global gradient norm of the whole global batch, an EMA of
  every weight evaluated and saved separately, optional stochastic depth, mixed precision
  where the hardware gains from it, multi-scale training;
- backends: TensorFlow trains with `ClassifierTrainer`'s own train step; JAX and PyTorch
  with Keras' train step (`keras_mvit2.training.keras_trainer`), on tf.data (JAX) or a
  `PyDataset` read with numpy / PIL (PyTorch);
- distribution: `tf.distribute` strategies (JAX: `keras.distribution.DataParallel`) with
  the linear batch / learning-rate rule;
  a training set smaller than one global batch trains with the batch lowered to fit it,
  and one line says so (`run_data.fit_batch_size`);
- outputs in `output.dir`: `config.yaml` (the final config) and `run.json` (derived
  values), `checkpoints/epoch_NNNN.weights.h5` + `checkpoints/state.json` after every
  epoch (resumed automatically), `tensorboard/`, `model.keras` and `model_ema.keras`
  (float32 inference models with softmax), `metrics.json`;
- the run folder: before training, one line says what happens with it (a new run,
  resuming at epoch k of n, already complete, or refused: another model, or another length
  or schedule without `replan=True`), see `keras_mvit2.training.run_folder`; the progress
  is Keras' bar on a terminal and one line per epoch otherwise
  (`keras_mvit2.utils.progress`).

A non-finite loss (or weight) stops the run at once with `TrainingDivergedError`
(`keras_mvit2.training.divergence`): the checkpoints of earlier epochs stay, nothing of the
diverged epoch and no model is written, and a rerun resumes from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import keras
import numpy as np

from keras_mvit2.backend import keras_backend_name, tensorflow_hidden_from_keras, variants
from keras_mvit2.models.weights_source import WeightsSource, resolve_weights_source
from keras_mvit2.training.checkpoints import TrainingState, resume_from
from keras_mvit2.training.classifier import build_classifier, check_pretrained_weights
from keras_mvit2.training.config import TrainConfig, load_config
from keras_mvit2.training.determinism import _make_deterministic
from keras_mvit2.training.distribute import (
    is_chief,
    make_strategy,
    precision_policy,
    resolve_precision,
)
from keras_mvit2.training.ema import ExponentialMovingAverage
from keras_mvit2.training.epochs import fit_epochs
from keras_mvit2.training.evaluation import EvalResult, evaluate
from keras_mvit2.training.keras_distribution import KerasDistribution
from keras_mvit2.training.keras_trainer import KerasClassifierTrainer
from keras_mvit2.training.optimizer import make_optimizer, plan_schedule
from keras_mvit2.training.records import (
    TrainResult,
    make_run_info,
    save_inference_models,
    update_run_json,
    write_metrics,
    write_run_files,
)
from keras_mvit2.training.run_data import RunData, build_run_data
from keras_mvit2.training.run_folder import RunPlan, SchedulePlan, plan_run, prepare_folder

if variants().tensorflow_train_step:  # keras_mvit2.backend.variants
    from keras_mvit2.training.train_step import ClassifierTrainer
elif TYPE_CHECKING:
    from keras_mvit2.training.train_step import ClassifierTrainer

__all__ = ["build_trainer", "finetune", "train"]

logger = logging.getLogger("keras_mvit2.training")


def build_trainer(
    config: TrainConfig,
    num_classes: int,
    schedule: keras.optimizers.schedules.LearningRateSchedule | float,
    precision: str = "float32",
    *,
    multiscale: bool = False,
    classifier: keras.Model | None = None,
) -> ClassifierTrainer | KerasClassifierTrainer:
    """The compiled `ClassifierTrainer` of `config`: classifier, optimizer, EMA, loss, metrics.

    On JAX and PyTorch a `KerasClassifierTrainer` (`keras_trainer`): JAX always compiles
    its step, PyTorch runs it eagerly; `training.jit_compile` is TensorFlow's XLA switch.

    This is the training model `train` fits (call it inside `strategy.scope()` when
    distributing); benchmarks use it to time exactly the same train step.

    Args:
        config: the `TrainConfig` (model, optimizer, EMA, label smoothing, clipping,
            `training.jit_compile`, `training.steps_per_execution`).
        num_classes: classifier size.
        schedule: the learning rate (a schedule or a float, already scaled for replicas).
        precision: the Keras dtype policy in effect (`mixed_float16` adds loss scaling).
        multiscale: train on batches of several sizes: the classifier takes any size.
        classifier: the network to train instead of `build_classifier(config, ...)`
            (benchmarks time other layouts with the same recipe).
    """
    size = config.model.image_size
    backend = keras_backend_name()
    if backend != "tensorflow":
        _check_keras_backend_config(config, backend, multiscale)
    if classifier is None:
        classifier = build_classifier(config, num_classes, any_size=multiscale)
    ema = None
    if config.ema.enabled:
        ema = ExponentialMovingAverage(config.ema.decay, config.ema.warmup, name="ema")
        ema.track(classifier.weights)
    example = (np.zeros((1, size, size, 3), "float32"), np.zeros((1, num_classes), "float32"))
    jit_compile, clip = config.training.jit_compile, config.optimizer.clip_global_norm
    if variants(backend).tensorflow_train_step:
        optimizer = make_optimizer(config, schedule, classifier.trainable_weights, precision)
        trainer_class = ClassifierTrainer
    else:
        optimizer = make_optimizer(config, schedule, classifier.trainable_weights, precision,
                                   global_clipnorm=clip)
        trainer_class, jit_compile = KerasClassifierTrainer, backend == "jax"
    trainer = trainer_class(classifier, multiscale=multiscale, ema=ema, clip_global_norm=clip,
                            example_batch=example)
    trainer.compile(
        optimizer=optimizer,
        loss=keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=config.training.label_smoothing),
        metrics=[keras.metrics.CategoricalAccuracy(name="accuracy"),
                 keras.metrics.TopKCategoricalAccuracy(k=min(5, num_classes), name="top5")],
        steps_per_execution=config.training.steps_per_execution,
        jit_compile=jit_compile,
    )
    return trainer


def _check_keras_backend_config(config: TrainConfig, backend: str, multiscale: bool) -> None:
    """Refuses what only the TensorFlow train step does, naming the backend and the fix."""
    if (multiscale or config.multiscale.enabled) and backend != "jax":
        raise ValueError(
            f"multiscale.enabled: multi-scale training runs on the TensorFlow and JAX "
            f"backends only (their input is tf.data's multi-scale batches; PyTorch's numpy "
            f"batches have one size), and Keras runs on {backend!r} here. Train with "
            "KERAS_BACKEND=tensorflow or jax, or at one size with "
            "--set multiscale.enabled=false.")
    if config.ema.enabled and config.training.steps_per_execution != 1:
        raise ValueError(
            f"training.steps_per_execution={config.training.steps_per_execution} with the EMA "
            f"on the {backend!r} backend: the EMA is updated after every optimizer step by a "
            "callback, which Keras calls once per execution. Set "
            "training.steps_per_execution=1, or train with KERAS_BACKEND=tensorflow.")


def train(
    config: TrainConfig | str | os.PathLike | dict,
    *,
    callbacks: Sequence[keras.callbacks.Callback] | None = None,
    replan: bool = False,
    on_plan: Callable[[RunPlan], None] | None = None,
) -> TrainResult:
    """Trains a classifier as `config` says, resuming from `output.dir` if it holds a run.

    Args:
        config: a `TrainConfig` (or anything `load_config` takes: a YAML path, a packaged
            config name, a dict).
        callbacks: extra Keras callbacks for every epoch's `fit` (their `model` is the
            `ClassifierTrainer`; its `classifier` attribute is the network).
        replan: continue the run in `output.dir` even if its length or schedule changed
            (`training.epochs`, `training.steps_per_epoch`, the batch or a rate), with the
            learning rate re-planned from its current step to the new end (`mvit2 train
            --resume`); without it such a run is refused.
        on_plan: called with the `RunPlan` (what happens with the run folder) before
            training; by default its `notes` (a `data.batch_size` larger than the
            training set is lowered to fit it, `run_data.fit_batch_size`) and `line` are
            printed when `output.verbose` is not 0.

    Returns:
        A `TrainResult`.

    Raises:
        ValueError: the run folder is refused (the message is the one line): it holds a
            run of another model, or of another length or schedule and `replan` is false.
        TrainingDivergedError: the loss or a weight became NaN or infinite. Training stops
            after that batch; the checkpoints of the earlier epochs stay and a rerun (with
            a lower learning rate, say, and `replan=True` for the changed rate) resumes
            from the last one; no model is written.

    Notes:
        Epochs are run one `fit` call each, on a dataset built with seed `data.seed + e`,
        and a checkpoint (weights, optimizer state and step count, EMA, dropout seeds,
        history, the plan and its learning-rate schedule) is written after each,
        atomically. A run killed at any point and started again with the same config
        resumes after the last completed epoch, at the same optimizer step and schedule
        position, and finishes with the same weights as an uninterrupted run (bitwise
        with `training.deterministic: true` in a process started with
        `DETERMINISTIC_ENV`, see `_make_deterministic`; otherwise kernels may round
        differently, ~1e-7 relative, and the difference grows over steps).
        Under `multi_worker`, `output.dir` must be a folder every worker sees (a shared
        disk such as NFS; files are written with local renames, so not an object store);
        only the chief writes.
    """
    if not isinstance(config, TrainConfig):
        config = load_config(config)
    if keras_backend_name() != "tensorflow":  # before any data is read
        _check_keras_backend_config(config, keras_backend_name(), multiscale=False)
    # PyTorch: Keras' own uses of TensorFlow (seeding, serialization) see it as not installed.
    with tensorflow_hidden_from_keras():
        if config.training.deterministic:
            _make_deterministic()  # before the strategy starts TensorFlow's runtime
        strategy = make_strategy(config.training.strategy, tpu=config.training.tpu)
        policy = resolve_precision(config.training.precision, strategy)
        # JAX / PyTorch: Keras' distribution is read when `fit` runs, not only when the model
        # is built (a tf.distribute strategy is the model's own): all of the run inside it.
        keras_scope = (strategy.scope() if isinstance(strategy, KerasDistribution)
                       else contextlib.nullcontext())
        with precision_policy(policy), keras_scope:
            return _train(config, strategy, policy, list(callbacks or []), replan, on_plan)


def _train(config: TrainConfig, strategy, policy: str, user_callbacks: list, replan: bool,
           on_plan: Callable[[RunPlan], None] | None) -> TrainResult:
    """The steps of `train` inside its precision policy: data, run folder, model, epochs,
    final models and metrics."""
    chief = is_chief(strategy)
    out = os.path.abspath(config.output.dir)
    check_pretrained_weights(config)  # before the data is read
    keras.utils.set_random_seed(config.training.seed)
    data = build_run_data(config, strategy.num_replicas_in_sync)
    config = data.config  # with a batch that fits a small training set
    wanted = plan_schedule(config, data)
    plan = _plan_folder(config, wanted, replan, chief, on_plan,
                        notes=[data.batch_line] if data.batch_line else [])
    val_ds = data.validation_dataset()
    with strategy.scope():
        trainer = build_trainer(config, data.num_classes, plan.learning_rate, policy,
                                multiscale=bool(data.pairs))
    state = resume_from(trainer, plan.state)
    run_info = make_run_info(config, trainer.classifier, data, wanted, plan, policy)
    if chief:
        write_run_files(config, out, run_info)
    fit_val_ds = val_ds
    if isinstance(strategy, KerasDistribution):
        fit_val_ds = strategy.whole_batches(
            val_ds, 0 if data.val_source is None else data.val_source.num_examples,
            data.eval_batch)
    fit_epochs(config, trainer, data, fit_val_ds, plan, wanted, policy=policy,
               user_callbacks=user_callbacks, out=out, chief=chief, state=state)
    # The inference models on one device: they evaluate every image, the last batch too.
    with (strategy.one_device() if isinstance(strategy, KerasDistribution)
          else contextlib.nullcontext()):
        return _finish(config, trainer, data, val_ds, plan, run_info, state, out, chief)


def _plan_folder(config: TrainConfig, wanted: SchedulePlan, replan: bool, chief: bool,
                 on_plan: Callable[[RunPlan], None] | None,
                 notes: list[str] | None = None) -> RunPlan:
    """The run folder: new, resumed, complete or refused; one line says which, after the
    `notes` (`RunPlan.notes`: the batch lowered to fit the data)."""
    plan = plan_run(config, wanted, replan=replan)
    if notes:
        plan = dataclasses.replace(plan, notes=list(notes))
    if chief:
        prepare_folder(plan)
    for line in (*plan.notes, plan.line):
        logger.info(line)
    if on_plan is not None:
        on_plan(plan)
    elif chief and config.output.verbose:
        for line in (*plan.notes, plan.line):
            print(line, flush=True)
    return plan


def _finish(config: TrainConfig, trainer: ClassifierTrainer, data: RunData, val_ds,
            plan: RunPlan, run_info: dict, state: TrainingState, out: str,
            chief: bool) -> TrainResult:
    """Saves the inference models, evaluates them, writes `metrics.json` (chief only)."""
    models = save_inference_models(config, data.num_classes, trainer.classifier, trainer.ema,
                                   out, chief)
    metrics: dict[str, EvalResult] = {}
    if val_ds is not None:
        steps = config.training.validation_steps
        metrics["raw"] = evaluate(models.raw, val_ds, data.class_names, steps=steps)
        if models.ema is not None:
            metrics["ema"] = evaluate(models.ema, val_ds, data.class_names, steps=steps)
    images_per_second = state.images_per_second()
    skipped = data.train_source.skipped.count
    if skipped:
        logger.warning(data.train_source.skipped.report())
    if chief:
        write_metrics(out, metrics, state.history, images_per_second, skipped, run_info)
    return TrainResult(
        history=state.history,
        output_dir=out,
        config_path=os.path.join(out, "config.yaml"),
        checkpoint_path=state.checkpoint_path,
        model_path=models.raw_path if chief else None,
        ema_model_path=models.ema_path if chief else None,
        metrics=metrics,
        images_per_second=images_per_second,
        initial_epoch=state.initial_epoch,
        optimizer_step=int(trainer.optimizer.iterations.numpy()),
        global_batch_size=data.scaling.global_batch,
        learning_rate=run_info["peak_lr"],
        num_replicas=data.scaling.replicas,
        precision=run_info["precision"],
        attention=run_info["attention"],
        skipped_images=skipped,
        plan=plan,
    )


def finetune(
    config: TrainConfig | str | os.PathLike | dict,
    weights: str | os.PathLike | WeightsSource | None,
    *,
    freeze_backbone: bool = False,
    new_head: bool = True,
    callbacks: Sequence[keras.callbacks.Callback] | None = None,
    replan: bool = False,
    on_plan: Callable[[RunPlan], None] | None = None,
) -> TrainResult:
    """Fine-tunes from pretrained weights with a new classifier for the config's data.

    Same as `train(config)` with `model.weights` set to the resolved file,
    `model.freeze_backbone` and `model.new_head` set: the backbone comes from an ml-cvnets
    / timm / HF checkpoint (ported by `load_torch_weights`) or a Keras `.weights.h5`, the
    classifier is new (sized for the data's classes) unless `new_head=False` and the sizes
    match. Where the weights came from (kind, tag, repository, SHA-256, licence) is added
    to `run.json` under `"weights"`.

    Args:
        config: as `train` (e.g. the packaged `finetune_small_data` recipe).
        weights: a checkpoint file, a published tag of `config.model.name` (`"imagenet"`,
            downloaded once and cached), a KerasHub preset name, an `hf://<owner>/<repo>`
            id, None / `"none"` for random initialization, or a resolved `WeightsSource`
            (`keras_mvit2.models.weights_source`).
        freeze_backbone: train only the classifier; the frozen BatchNorms use their
            pretrained statistics.
        new_head: always start from a new classifier.
        callbacks: as `train`.
        replan: as `train`.
        on_plan: as `train`.
    """
    if not isinstance(config, TrainConfig):
        config = load_config(config)
    source = weights if isinstance(weights, WeightsSource) else resolve_weights_source(
        weights, config.model.name)
    config = config.replace(model={"weights": source.path,
                                   "freeze_backbone": freeze_backbone, "new_head": new_head})
    result = train(config, callbacks=callbacks, replan=replan, on_plan=on_plan)
    if result.model_path is not None:  # the chief wrote the run folder
        update_run_json(result.output_dir, {"weights": source.to_dict()})
    return result
