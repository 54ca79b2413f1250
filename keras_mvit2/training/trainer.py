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
- distribution: `tf.distribute` strategies with the linear batch / learning-rate rule;
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

import collections
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import (
    _collective_all_reduce_multi_worker,
    reduce_per_replica,
)
from keras.src.losses import loss as loss_module

from keras_mvit2 import data as mvdata
from keras_mvit2._version import __version__
from keras_mvit2.attention import names_in as attention_names_in
from keras_mvit2.models import create_model
from keras_mvit2.training.config import TrainConfig, load_config
from keras_mvit2.training.distribute import (
    Scaling,
    is_chief,
    make_strategy,
    precision_policy,
    resolve_precision,
    scale_for_replicas,
)
from keras_mvit2.training.divergence import (
    StopOnNonFiniteLoss,
    diverged_error,
    non_finite_weights,
)
from keras_mvit2.training.ema import ExponentialMovingAverage, _Untracked
from keras_mvit2.training.run_folder import (
    STATE_FILE,
    RunPlan,
    SchedulePlan,
    checkpoint_record,
    plan_fields,
    plan_run,
    prepare_folder,
)
from keras_mvit2.utils.files import atomic_output, write_json
from keras_mvit2.utils.progress import EpochProgress, progress_verbose

logger = logging.getLogger("keras_mvit2.training")

HEAD_LAYERS = ("predictions", "head_dropout")


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class EvalResult:
    """Classification metrics of one model on one dataset.

    Attributes:
        top1, top5: accuracies in [0, 1] (top-5 is top-k with k = min(5, classes)).
        per_class_accuracy: float array `(num_classes,)`, recall of each class (NaN for a
            class without examples).
        confusion_matrix: int64 array `(num_classes, num_classes)`; rows are true classes,
            columns predicted ones.
        class_names: list of str, in label order.
        num_examples: int.
    """

    top1: float
    top5: float
    per_class_accuracy: np.ndarray
    confusion_matrix: np.ndarray
    class_names: list[str]
    num_examples: int

    def per_class(self) -> dict[str, float]:
        """`{class name: accuracy}`."""
        return dict(zip(self.class_names, (float(a) for a in self.per_class_accuracy), strict=True))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "top1": self.top1,
            "top5": self.top5,
            "num_examples": self.num_examples,
            "per_class_accuracy": {k: (None if np.isnan(v) else v)
                                   for k, v in self.per_class().items()},
            "confusion_matrix": self.confusion_matrix.tolist(),
            "class_names": list(self.class_names),
        }


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
            fit excluded: it includes tracing).
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


# --------------------------------------------------------------------------------------
# The training model
# --------------------------------------------------------------------------------------


class ClassifierTrainer(keras.Model):
    """Wraps a classifier for `fit`: recipe-level gradient clipping, EMA, multi-scale.

    `train_step` is Keras' TF train step plus: (1) when `clip_global_norm` is set, the
    gradients of all replicas are summed (all-reduce) and clipped to that global norm
    before the optimizer sees them, so clipping acts on the gradient of the whole global
    batch as with one device (Keras' own `global_clipnorm` clips each replica's part
    before the all-reduce); (2) after each optimizer step the EMA is updated.

    Multi-scale: the classifier is built for any input size (`input_shape=(None, None,
    3)`) and every batch shape runs through it, one model and one set of weights. The
    train function is then a `tf.function` with `reduce_retracing=True` (Keras' default
    function is traced for the dataset's unknown spatial size, which a step cannot
    route): the first batch shape is traced as it is, the second generalizes it to one
    trace for every shape. `benchmarks/training_throughput.py --multiscale` measured that
    as fast as one trace per shape (`reduce_retracing=False`, the graph of a model built
    for each size) and as one model per resolution sharing the layers (0.1's layout),
    with fewer traces: see `benchmarks/results/training_throughput_multiscale.md`.

    Args:
        classifier: the (logits) classifier, built; for multi-scale, built for any size.
        multiscale: batches of several shapes (the multi-scale train function).
        ema: optional `ExponentialMovingAverage` tracking `classifier.weights`.
        clip_global_norm: optional float.
        example_batch: `(images, labels)` arrays with the shapes of a batch, used to build
            metrics without pulling a batch from the training data.
    """

    def __init__(
        self,
        classifier: keras.Model,
        *,
        multiscale: bool = False,
        ema: ExponentialMovingAverage | None = None,
        clip_global_norm: float | None = None,
        example_batch: tuple[np.ndarray, np.ndarray] | None = None,
        **kwargs,
    ):
        super().__init__(name=kwargs.pop("name", "trainer"), **kwargs)
        self.classifier = classifier
        self.ema = ema
        self.clip_global_norm = clip_global_norm
        self._multiscale = multiscale
        self._example_batch = _Untracked(list(example_batch) if example_batch else [])
        self._batch_shapes = _Untracked([collections.Counter()])
        self.built = True

    #: Multi-scale train function: True generalizes to one trace for every batch shape,
    #: False traces once per shape (measured no faster, see the class docstring).
    reduce_retracing = True

    @property
    def batch_shapes(self) -> collections.Counter:
        """Multi-scale mode: training steps run per (replica-local) image batch shape."""
        return self._batch_shapes.items[0]

    @property
    def multiscale(self) -> bool:
        return self._multiscale

    def call(self, inputs, training=None):
        logits = self.classifier(inputs, training=training)
        return tf.cast(logits, "float32")  # loss and metrics in float32 under mixed precision

    def _loss_scale(self):
        scale = getattr(self.optimizer, "dynamic_scale", None)
        if scale is None:
            scale = self.optimizer.loss_scale_factor
        return scale

    def _clip_global(self, grads):
        """All-reduce (sum over replicas), unscale, clip to the global norm, re-split."""
        replicas = self.distribute_strategy.num_replicas_in_sync
        if replicas > 1:
            grads = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, grads
            )
        scale = self._loss_scale()
        if scale is not None:
            grads = [g / ops_cast(scale, g.dtype) for g in grads]
        grads, _ = tf.clip_by_global_norm(grads, self.clip_global_norm)
        # The optimizer all-reduces (sums) again: give each replica 1/replicas of the total.
        factor = 1.0 / replicas
        if scale is not None:
            return [g * ops_cast(scale, g.dtype) * factor for g in grads]
        return [g * factor for g in grads] if replicas > 1 else grads

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self._compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            self._loss_tracker.update_state(
                loss_module.unscale_loss_for_distribution(loss),
                sample_weight=tf.shape(x)[0],
            )
            loss = self.optimizer.scale_loss(loss)
        weights = self.trainable_weights
        grads = tape.gradient(loss, weights)
        if self.clip_global_norm:
            grads = self._clip_global(grads)
        self.optimizer.apply(grads, weights)
        if self.ema is not None:
            self.ema.update(self.optimizer.iterations)
        return self._reducible(self.compute_metrics(x, y, y_pred, sample_weight=sample_weight))

    def test_step(self, data):
        return self._reducible(super().test_step(data))

    def _reducible(self, logs):
        # Keras 3.15 reduces step outputs across workers with
        # `strategy.reduce("MEAN", v, axis=0)`, which fails on scalar logs under
        # MultiWorkerMirroredStrategy ("Invalid reduction dimension 0 for input with 0
        # dimensions"): give them a leading axis of 1 there; the reduction removes it.
        if not _collective_all_reduce_multi_worker(self.distribute_strategy):
            return logs
        return {k: tf.reshape(v, [1]) if len(v.shape) == 0 else v for k, v in logs.items()}

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras pulls a batch from the training iterator to build metrics under a
        # distribution strategy, which would start a second pass over the data (another
        # shuffle): build from an example batch of the right shapes instead.
        if data_batch is None and self._example_batch.items:
            data_batch = tuple(self._example_batch.items)
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def make_train_function(self, force=False):
        if not self.multiscale:
            return super().make_train_function(force)
        if self.train_function is not None and not force:
            return self.train_function
        strategy = self.distribute_strategy

        @tf.autograph.experimental.do_not_convert
        def one_step_on_data(data):
            outputs = strategy.run(self.train_step, args=(data,))
            return reduce_per_replica(outputs, strategy, reduction="auto")

        one_step_on_data = tf.function(one_step_on_data,
                                       reduce_retracing=self.reduce_retracing)

        def function(iterator):
            data = next(iterator)
            images = tf.nest.flatten(data)[0]
            if isinstance(images, tf.distribute.DistributedValues):
                images = strategy.experimental_local_results(images)[0]
            self.batch_shapes[tuple(images.shape)] += 1
            return one_step_on_data(data)

        self.train_function = function
        return function


def ops_cast(x, dtype):
    return tf.cast(tf.convert_to_tensor(x), dtype)


# --------------------------------------------------------------------------------------
# Callbacks
# --------------------------------------------------------------------------------------


class _EMAValidation(keras.callbacks.Callback):
    """After an epoch that validated, validates the EMA weights too (`val_ema_*` logs)."""

    def __init__(self, ema: ExponentialMovingAverage, dataset, steps: int | None):
        super().__init__()
        self.ema, self.dataset, self.steps = ema, dataset, steps

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or "val_loss" not in logs:
            return
        with self.ema.swapped():
            results = self.model.evaluate(
                self.dataset, steps=self.steps, verbose=0, return_dict=True
            )
        for key, value in results.items():
            logs[f"val_ema_{key}"] = float(value)


class _Throughput(keras.callbacks.Callback):
    """Times the training steps of each epoch (from the end of its first step)."""

    def __init__(self, global_batch: int):
        super().__init__()
        self.global_batch = global_batch
        self.reset()

    def reset(self):
        self.first = self.last = None
        self.steps = 0
        self.epoch_start = None

    def on_epoch_begin(self, epoch, logs=None):
        self.reset()
        self.epoch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        else:
            self.steps += 1
        self.last = now

    def images_per_second(self) -> tuple[float, int, float]:
        """(images/s, timed images, timed seconds) of the last epoch."""
        if self.steps == 0 or self.last <= self.first:
            return float("nan"), 0, 0.0
        seconds = self.last - self.first
        images = self.steps * self.global_batch
        return images / seconds, images, seconds


# --------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------


def _limited(source: mvdata.ImageSource, limit: int | None) -> mvdata.ImageSource:
    if limit is None or limit >= source.num_examples:
        return source
    return dataclasses.replace(
        source,
        dataset=source.dataset.take(limit),
        num_examples=limit,
        make_records=None,
        decode_record=None,
        shuffle_records=False,
    )


def make_sources(
    config: TrainConfig,
) -> tuple[mvdata.ImageSource, mvdata.ImageSource | None]:
    """The training and validation `ImageSource`s of `config.data` (validation may be None)."""
    d = config.data
    if d.source == "fashion_mnist":
        train_kw = {} if d.train is None else {"data_dir": d.train}
        train = mvdata.fashion_mnist(d.train_split, limit=d.train_limit, **train_kw)
        val = None
        if d.validation_split is not None:
            val_dir = d.validation or d.train
            val_kw = {} if val_dir is None else {"data_dir": val_dir}
            val = mvdata.fashion_mnist(d.validation_split, limit=d.validation_limit, **val_kw)
        return train, val
    if d.source == "image_folder":
        if d.validation is None and d.validation_fraction > 0:
            train = mvdata.image_folder(d.train, split="training",
                                        validation_fraction=d.validation_fraction, seed=d.seed)
            _check_two_classes(train, d.train)  # before the split's own checks
            val = mvdata.image_folder(d.train, split="validation",
                                      validation_fraction=d.validation_fraction, seed=d.seed)
        else:
            train = mvdata.image_folder(d.train)
            val = None if d.validation is None else mvdata.image_folder(d.validation)
    elif d.source == "tfrecords":
        train = mvdata.tfrecords(d.train, class_names=d.class_names)
        val = None if d.validation is None else mvdata.tfrecords(
            d.validation, class_names=d.class_names)
    else:  # tfds
        train = mvdata.tfds_source(d.tfds_name, d.train_split, data_dir=d.train)
        val = None if d.validation_split is None else mvdata.tfds_source(
            d.tfds_name, d.validation_split, data_dir=d.validation or d.train)
    _check_two_classes(train, d.train)
    return _limited(train, d.train_limit), (
        None if val is None else _limited(val, d.validation_limit))


def _check_two_classes(source: mvdata.ImageSource, where: str | None) -> None:
    names = list(source.class_names)
    if len(names) < 2:
        raise ValueError(
            f"The training data {where!r} has {len(names)} class ({names}); a classifier "
            "needs at least two classes. For an image folder, put each class's images in its "
            "own sub-folder (DIR/<class>/*.jpg) with at least two sub-folders."
        )


def _build_kwargs(config: TrainConfig, num_classes: int, *,
                  any_size: bool = False) -> dict[str, Any]:
    m = config.model
    side = None if any_size else m.image_size
    kwargs: dict[str, Any] = {
        "input_shape": (side, side, 3),
        "classes": num_classes,
    }
    if m.dropout:
        kwargs["dropout"] = m.dropout
    if m.drop_path_rate:
        kwargs["drop_path_rate"] = m.drop_path_rate
    if m.attention is not None:
        kwargs["attention"] = m.attention
    return kwargs


def _h5_head_classes(path: str) -> int | None:
    import h5py

    with h5py.File(path, "r") as f:
        key = "layers/predictions/vars/0"
        return int(f[key].shape[-1]) if key in f else None


def load_pretrained(model: keras.Model, config: TrainConfig, num_classes: int) -> int:
    """Copies pretrained weights (`config.model.weights`) into `model`, layer by layer.

    The source is an Apple ml-cvnets / timm / HF checkpoint (ported with
    `load_torch_weights`) or a Keras `.weights.h5` of the same architecture (any
    classifier size, or none). The classifier is copied only when `model.new_head` is
    false and the source's classifier has `num_classes` outputs; otherwise it keeps its
    fresh initialization. Returns the number of layers copied.
    """
    path = config.model.weights
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"Pretrained weights not found: {path!r} (config model.weights). Pass an "
            "ml-cvnets .pt, a timm .pth/.bin/.safetensors or a Keras .weights.h5."
        )
    kwargs = _build_kwargs(config, num_classes)
    kwargs.pop("classes")
    with precision_policy("float32"):
        if path.endswith(".weights.h5"):
            head = _h5_head_classes(path)
            donor = create_model(config.model.name, include_top=head is not None,
                                 classes=head or 1, classifier_activation=None, **kwargs)
            donor.load_weights(path)
        else:
            head = num_classes if not config.model.new_head else None
            donor = create_model(config.model.name, include_top=head is not None,
                                 classes=head or 1, classifier_activation=None,
                                 weights=path, **kwargs)
    copy_head = not config.model.new_head and head == num_classes
    copied = 0
    names = {layer.name for layer in model.layers}
    for layer in donor.layers:
        if not layer.weights or layer.name not in names:
            continue
        if layer.name in HEAD_LAYERS and not copy_head:
            continue
        model.get_layer(layer.name).set_weights(layer.get_weights())
        copied += 1
    if copied == 0:
        raise ValueError(
            f"No layer of {path!r} matches the model {config.model.name!r}; is it a "
            f"checkpoint of this architecture? Received: weights={path!r}"
        )
    return copied


def build_classifier(config: TrainConfig, num_classes: int, *,
                     any_size: bool = False) -> keras.Model:
    """The training classifier (logits), with pretrained weights and freezing applied.

    Built for `config.model.image_size`, or for any input size with `any_size` (the
    multi-scale classifier: one model for every batch shape).
    """
    model = create_model(config.model.name, classifier_activation=None,
                         **_build_kwargs(config, num_classes, any_size=any_size))
    if config.model.weights:
        load_pretrained(model, config, num_classes)
    if config.model.freeze_backbone:
        for layer in model.layers:
            layer.trainable = layer.name in HEAD_LAYERS
    if config.model.sync_batch_norm:
        for layer in model._flatten_layers():
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.synchronized = True
    return model


def build_inference_model(config: TrainConfig, num_classes: int,
                          values: Sequence[np.ndarray]) -> keras.Model:
    """The float32 model with softmax that is saved: same architecture, given weights."""
    with precision_policy("float32"):
        model = create_model(config.model.name, classifier_activation="softmax",
                             **_build_kwargs(config, num_classes))
    if len(values) != len(model.weights):
        raise ValueError(
            f"Expected {len(model.weights)} weight arrays for {config.model.name!r}. "
            f"Received: {len(values)}"
        )
    model.set_weights(list(values))
    return model


def make_optimizer(config: TrainConfig, schedule, trainable: Sequence[keras.Variable],
                   precision: str) -> keras.optimizers.Optimizer:
    """AdamW / SGD on `schedule`, no weight decay on 1-D weights, loss scaling for fp16."""
    o = config.optimizer
    if o.name == "adamw":
        optimizer = keras.optimizers.AdamW(
            learning_rate=schedule, weight_decay=o.weight_decay, beta_1=o.beta1,
            beta_2=o.beta2, epsilon=o.epsilon,
        )
    else:
        optimizer = keras.optimizers.SGD(
            learning_rate=schedule, momentum=o.momentum, nesterov=o.nesterov,
            weight_decay=o.weight_decay or None,
        )
    if o.no_decay_1d and o.weight_decay:
        optimizer.exclude_from_weight_decay(var_list=[v for v in trainable if len(v.shape) <= 1])
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(list(trainable))
    return optimizer


def build_trainer(
    config: TrainConfig,
    num_classes: int,
    schedule: keras.optimizers.schedules.LearningRateSchedule | float,
    precision: str = "float32",
    *,
    multiscale: bool = False,
    classifier: keras.Model | None = None,
) -> ClassifierTrainer:
    """The compiled `ClassifierTrainer` of `config`: classifier, optimizer, EMA, loss, metrics.

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
    if classifier is None:
        classifier = build_classifier(config, num_classes, any_size=multiscale)
    optimizer = make_optimizer(config, schedule, classifier.trainable_weights, precision)
    ema = None
    if config.ema.enabled:
        ema = ExponentialMovingAverage(config.ema.decay, config.ema.warmup, name="ema")
        ema.track(classifier.weights)
    example = (np.zeros((1, size, size, 3), "float32"), np.zeros((1, num_classes), "float32"))
    trainer = ClassifierTrainer(
        classifier, multiscale=multiscale, ema=ema,
        clip_global_norm=config.optimizer.clip_global_norm, example_batch=example)
    trainer.compile(
        optimizer=optimizer,
        loss=keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=config.training.label_smoothing),
        metrics=[keras.metrics.CategoricalAccuracy(name="accuracy"),
                 keras.metrics.TopKCategoricalAccuracy(k=min(5, num_classes), name="top5")],
        steps_per_execution=config.training.steps_per_execution,
        jit_compile=config.training.jit_compile,
    )
    return trainer


def evaluate(
    model: keras.Model,
    dataset: tf.data.Dataset,
    class_names: Sequence[str],
    *,
    steps: int | None = None,
) -> EvalResult:
    """Top-1, top-5, per-class accuracy and the confusion matrix of `model` on `dataset`.

    Args:
        model: a classifier returning scores (probabilities or logits) `(B, classes)`.
        dataset: `(images, labels)` batches, labels one-hot / soft `(B, classes)` (argmax
            is the true class) or int `(B,)`, e.g. `keras_mvit2.data.make_eval_dataset`.
        class_names: the class names, in label order.
        steps: evaluate only the first `steps` batches.

    Returns:
        An `EvalResult`.
    """
    num_classes = len(class_names)
    if num_classes < 1:
        raise ValueError(f"class_names must not be empty. Received: {list(class_names)}")
    if model.output_shape[-1] != num_classes:
        raise ValueError(
            f"The model has {model.output_shape[-1]} outputs but there are {num_classes} "
            f"class names. Received: class_names={list(class_names)}"
        )
    k = min(5, num_classes)
    confusion = np.zeros((num_classes, num_classes), np.int64)
    top5_hits = 0
    for i, (images, labels) in enumerate(dataset):
        if steps is not None and i >= steps:
            break
        scores = np.asarray(model.predict_on_batch(images))  # Keras' cached predict function
        labels = np.asarray(labels)
        truth = labels.argmax(-1) if labels.ndim == 2 else labels.astype(np.int64)
        np.add.at(confusion, (truth, scores.argmax(-1)), 1)
        topk = np.argpartition(-scores, k - 1, axis=-1)[:, :k]
        top5_hits += int((topk == truth[:, None]).any(-1).sum())
    n = int(confusion.sum())
    if n == 0:
        raise ValueError("The evaluation dataset is empty.")
    support = confusion.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.where(support > 0, np.diag(confusion) / np.maximum(support, 1), np.nan)
    return EvalResult(
        top1=float(np.trace(confusion) / n),
        top5=float(top5_hits / n),
        per_class_accuracy=per_class.astype(np.float64),
        confusion_matrix=confusion,
        class_names=list(class_names),
        num_examples=n,
    )


# --------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------


def _seed_variables(model: keras.Model) -> list:
    """The states of the model's random layers (dropout, stochastic depth), in layer order."""
    return [v for v in model.variables if "seed_generator_state" in v.path]


def _seed_states(model: keras.Model) -> list[list[int]]:
    # Saved by position: the variables' names carry a per-process counter
    # ("seed_generator_12"), their order follows the architecture.
    return [np.asarray(v.numpy()).tolist() for v in _seed_variables(model)]


def _restore_seed_states(model: keras.Model, states: list[list[int]]) -> None:
    variables = _seed_variables(model)
    if len(states) != len(variables):
        raise ValueError(
            f"The checkpoint holds {len(states)} random-layer states but the model has "
            f"{len(variables)}; it was written by another architecture."
        )
    for v, state in zip(variables, states, strict=True):
        v.assign(np.asarray(state, dtype=v.dtype))


def _save_checkpoint(trainer: ClassifierTrainer, ckpt_dir: str, epoch: int,
                     history: list[dict], keep: int, record: dict[str, Any]) -> str:
    name = f"epoch_{epoch:04d}.weights.h5"
    path = os.path.join(ckpt_dir, name)
    with atomic_output(path) as tmp:
        trainer.save_weights(tmp)
    state = {
        "epoch": epoch,
        "optimizer_step": int(trainer.optimizer.iterations.numpy()),
        "checkpoint": name,
        "seed_states": _seed_states(trainer.classifier),
        "history": history,
        **record,  # the plan and learning-rate schedule (`run_folder.checkpoint_record`)
    }
    write_json(os.path.join(ckpt_dir, STATE_FILE), state)
    old = sorted(f for f in os.listdir(ckpt_dir)
                 if f.startswith("epoch_") and f.endswith(".weights.h5"))
    for f in old[:-keep]:
        os.remove(os.path.join(ckpt_dir, f))
    return path


# --------------------------------------------------------------------------------------
# train / finetune
# --------------------------------------------------------------------------------------


def _tensorboard_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def _steps_per_epoch(config: TrainConfig, num_examples: int, scaling: Scaling,
                     pairs: list[tuple[int, int]] | None) -> int:
    if config.training.steps_per_epoch:
        return config.training.steps_per_epoch
    if pairs:
        steps = mvdata.multiscale_steps_per_epoch(num_examples, pairs)
    else:
        steps = mvdata.steps_per_epoch(num_examples, scaling.global_batch)
    if steps < 1:
        raise ValueError(
            f"The training data ({num_examples} images) is smaller than one global batch "
            f"({scaling.global_batch} = data.batch_size {scaling.batch_per_replica} x "
            f"{scaling.replicas} replicas). Use a smaller data.batch_size. "
            f"Received: batch_size={scaling.batch_per_replica}"
        )
    return steps


def _warmup_steps(config: TrainConfig, steps_per_epoch: int, total_steps: int) -> int:
    s = config.schedule
    steps = s.warmup_steps if s.warmup_steps is not None else round(
        s.warmup_epochs * steps_per_epoch)
    if steps > total_steps:
        raise ValueError(
            f"The warm-up ({steps} steps) is longer than the run ({total_steps} steps). "
            f"Received: warmup_steps={s.warmup_steps}, warmup_epochs={s.warmup_epochs}"
        )
    return steps


#: Environment variables TensorFlow reads once, when it loads: one intra-op and one
#: inter-op thread, and its Eigen kernels instead of oneDNN's. A process started with them
#: runs `training.deterministic` bitwise reproducibly (`_make_deterministic`).
DETERMINISTIC_ENV = {
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "TF_ENABLE_ONEDNN_OPTS": "0",
}


def _onednn_enabled() -> bool:
    """Whether this process's TensorFlow runs oneDNN kernels (decided when it loaded)."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:  # a TensorFlow without the probe: go by the variable
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS") != "0"
    return bool(_pywrap_util_port.IsMklEnabled())


def _make_deterministic() -> None:
    """Deterministic kernels on one intra-op and one inter-op thread, without oneDNN.

    `enable_op_determinism` is not enough on a CPU. Measured here (the same 12-step
    run, three processes at once on two cores):
    - with several threads, two identical runs differed in the last bit of the third
      epoch's loss;
    - with one thread of each kind but oneDNN's kernels (TensorFlow's default on x86),
      2 runs of 63 (and one CI run) took another path, one of them from the first
      optimizer step on (weights 1.6e-4 apart after 12 steps). The data pipeline alone
      and the train step on a fixed batch were bitwise repeatable; which oneDNN kernel
      varies was not pinned down (its primitives are cached per thread, and which
      thread runs a kernel depends on timing);
    - with one thread of each kind and Eigen's kernels, 78 of 78 runs were bitwise equal.
    Thread counts can still be set here if TensorFlow's runtime has not started; oneDNN
    is chosen when TensorFlow loads. What cannot be set any more is named in a warning
    that says how to start the process instead (`DETERMINISTIC_ENV`).
    """
    tf.config.experimental.enable_op_determinism()
    missing = []
    if _onednn_enabled():
        missing.append("TensorFlow loaded with oneDNN's kernels, which may run another "
                       "path depending on which thread runs them")
    threads_from_env = all(os.environ.get(k) == "1" for k in
                           ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"))
    if not threads_from_env:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:
            if (tf.config.threading.get_intra_op_parallelism_threads(),
                    tf.config.threading.get_inter_op_parallelism_threads()) != (1, 1):
                missing.append("TensorFlow already runs with several threads, whose "
                               "kernels may round differently from run to run under load")
    if missing:
        logger.warning(
            "training.deterministic: %s. For bitwise-reproducible runs start the process "
            "with %s.",
            "; ".join(missing),
            " ".join(f"{k}={v}" for k, v in DETERMINISTIC_ENV.items()),
        )


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
            training; by default its `line` is printed when `output.verbose` is not 0.

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
    if config.training.deterministic:
        _make_deterministic()  # before the strategy starts TensorFlow's runtime
    strategy = make_strategy(config.training.strategy, tpu=config.training.tpu)
    policy = resolve_precision(config.training.precision, strategy)
    with precision_policy(policy):
        return _train(config, strategy, policy, list(callbacks or []), replan, on_plan)


def _train(config: TrainConfig, strategy, policy: str, user_callbacks: list, replan: bool,
           on_plan: Callable[[RunPlan], None] | None) -> TrainResult:
    chief = is_chief(strategy)
    out = os.path.abspath(config.output.dir)
    ckpt_dir = os.path.join(out, "checkpoints")
    config_path = os.path.join(out, "config.yaml")
    if config.model.weights and not os.path.exists(config.model.weights):
        raise FileNotFoundError(
            f"Pretrained weights not found: {config.model.weights!r} (config model.weights). "
            "Pass an ml-cvnets .pt, a timm .pth/.bin/.safetensors or a Keras .weights.h5."
        )
    keras.utils.set_random_seed(config.training.seed)

    # --- data ---------------------------------------------------------------------
    train_source, val_source = make_sources(config)
    class_names = list(train_source.class_names)
    num_classes = config.model.num_classes or len(class_names)
    if num_classes < len(class_names):
        raise ValueError(
            f"model.num_classes={num_classes} is smaller than the {len(class_names)} classes "
            f"of the training data. Received: num_classes={num_classes}"
        )
    class_names += [f"class_{i}" for i in range(len(class_names), num_classes)]
    scaling = scale_for_replicas(config.data.batch_size, strategy.num_replicas_in_sync,
                                 config.optimizer.reference_batch_size)
    eval_batch = (config.data.eval_batch_size or config.data.batch_size) * scaling.replicas
    size = config.model.image_size
    pairs = None
    if config.multiscale.enabled:
        pairs = mvdata.multiscale_batch_pairs(
            size, scaling.global_batch, config.multiscale.scales,
            size_divisor=config.multiscale.size_divisor, batch_multiple=scaling.replicas)
    steps_per_epoch = _steps_per_epoch(config, train_source.num_examples, scaling, pairs)
    warmup_steps = _warmup_steps(config, steps_per_epoch,
                                 steps_per_epoch * config.training.epochs)
    peak_lr = config.optimizer.lr * scaling.lr_factor
    min_lr = peak_lr if config.schedule.name == "constant" else (
        config.schedule.min_lr * scaling.lr_factor)
    wanted = SchedulePlan(
        epochs=config.training.epochs, steps_per_epoch=steps_per_epoch,
        warmup_steps=warmup_steps, peak_lr=peak_lr, min_lr=min_lr,
        warmup_init_lr=config.schedule.warmup_init_lr * scaling.lr_factor,
        schedule=config.schedule.name, fields=plan_fields(config))

    # --- the run folder: new, resumed, complete or refused (one line says which) --------
    plan = plan_run(config, wanted, replan=replan)
    if chief:
        prepare_folder(plan)
    logger.info(plan.line)
    if on_plan is not None:
        on_plan(plan)
    elif chief and config.output.verbose:
        print(plan.line, flush=True)
    state, schedule, total_steps = plan.state, plan.learning_rate, plan.total_steps

    def train_dataset(epoch: int) -> tf.data.Dataset:
        seed = config.data.seed + epoch
        if pairs:
            return mvdata.make_multiscale_train_dataset(
                train_source, base_size=size, base_batch_size=scaling.global_batch,
                num_classes=num_classes, scales=config.multiscale.scales,
                size_divisor=config.multiscale.size_divisor, batch_multiple=scaling.replicas,
                augment=config.augment, seed=seed, shuffle_buffer=config.data.shuffle_buffer,
                repeat=True)
        return mvdata.make_train_dataset(
            train_source, image_size=size, batch_size=scaling.global_batch,
            num_classes=num_classes, augment=config.augment, seed=seed,
            shuffle_buffer=config.data.shuffle_buffer, repeat=True)

    val_ds = None
    if val_source is not None:
        val_ds = mvdata.make_eval_dataset(val_source, image_size=size, batch_size=eval_batch,
                                          num_classes=num_classes,
                                          crop_ratio=config.data.crop_ratio)

    # --- model, optimizer, EMA ------------------------------------------------------
    with strategy.scope():
        trainer = build_trainer(config, num_classes, schedule, policy,
                                multiscale=bool(pairs))
    classifier, optimizer, ema = trainer.classifier, trainer.optimizer, trainer.ema

    # --- resume ---------------------------------------------------------------------
    history: list[dict] = []
    initial_epoch = 0
    checkpoint_path = None
    if state is not None:
        trainer.load_weights(state["checkpoint_path"])
        _restore_seed_states(classifier, state.get("seed_states", []))
        initial_epoch = int(state["epoch"])
        history = list(state.get("history", []))
        checkpoint_path = state["checkpoint_path"]
        step = int(optimizer.iterations.numpy())
        if step != state["optimizer_step"]:
            raise ValueError(
                f"Checkpoint {checkpoint_path!r} restored optimizer step {step}, but its "
                f"state says {state['optimizer_step']}; the checkpoint is inconsistent."
            )

    run_info = {
        "model": config.model.name,
        "attention": attention_names_in(classifier),
        "num_replicas": scaling.replicas,
        "batch_per_replica": scaling.batch_per_replica,
        "global_batch_size": scaling.global_batch,
        "reference_batch_size": scaling.reference_batch,
        "lr_factor": scaling.lr_factor,
        "peak_lr": peak_lr,
        "min_lr": min_lr,
        "warmup_init_lr": wanted.warmup_init_lr,
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total_steps,
        "warmup_steps": warmup_steps,
        "learning_rate": keras.saving.serialize_keras_object(schedule),
        "multiscale_pairs": pairs,
        "precision": policy,
        "strategy": config.training.strategy,
        "num_classes": num_classes,
        "class_names": class_names,
        "train_examples": train_source.num_examples,
        "validation_examples": None if val_source is None else val_source.num_examples,
        "keras_mvit2": __version__,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }
    if chief:
        config.save(config_path)
        write_json(os.path.join(out, "run.json"), run_info)

    # --- epochs ---------------------------------------------------------------------
    throughput = _Throughput(scaling.global_batch)
    callbacks: list = []
    if ema is not None and val_ds is not None:
        callbacks.append(_EMAValidation(ema, val_ds, config.training.validation_steps))
    callbacks.append(throughput)
    if config.output.tensorboard and chief:
        if _tensorboard_available():
            callbacks.append(keras.callbacks.TensorBoard(os.path.join(out, "tensorboard"),
                                                         write_graph=False))
        else:
            logger.warning("output.tensorboard is on but the `tensorboard` package is not "
                           "installed (`pip install tensorboard`): no TensorBoard logs.")
    callbacks += user_callbacks
    stop_on_non_finite = StopOnNonFiniteLoss()
    callbacks.insert(0, stop_on_non_finite)
    verbose = progress_verbose(config.output.verbose) if chief else 0
    if verbose:  # last: it prints the logs the other callbacks completed
        callbacks.append(EpochProgress(config.training.epochs, verbose))
    record = checkpoint_record(wanted, schedule)
    timed_images, timed_seconds = 0, 0.0
    every = config.training.validate_every
    for epoch in range(initial_epoch, config.training.epochs):
        validate = val_ds is not None and every > 0 and (
            (epoch + 1) % every == 0 or epoch + 1 == config.training.epochs)
        start = time.perf_counter()
        fit = trainer.fit(
            train_dataset(epoch),
            epochs=epoch + 1,
            initial_epoch=epoch,
            steps_per_epoch=steps_per_epoch,
            validation_data=val_ds if validate else None,
            validation_steps=config.training.validation_steps if validate else None,
            callbacks=callbacks,
            verbose=verbose,
            shuffle=False,
        )
        seconds = time.perf_counter() - start
        bad = [] if stop_on_non_finite.batch is not None else non_finite_weights(
            classifier.weights)
        if stop_on_non_finite.batch is not None or bad:
            raise diverged_error(
                epoch=epoch + 1,
                batch=None if stop_on_non_finite.batch is None else stop_on_non_finite.batch + 1,
                loss=stop_on_non_finite.loss, bad_weights=bad, last_checkpoint=checkpoint_path,
                lr=config.optimizer.lr, clip_global_norm=config.optimizer.clip_global_norm,
                precision=policy)
        ips, images, timed = throughput.images_per_second()
        timed_images += images
        timed_seconds += timed
        step = int(optimizer.iterations.numpy())
        entry = {"epoch": epoch + 1, "step": step,
                 "learning_rate": float(schedule(step - 1)),
                 "seconds": seconds, "images_per_second": ips}
        entry.update({k: float(v[-1]) for k, v in fit.history.items()})
        history.append(entry)
        if chief:
            checkpoint_path = _save_checkpoint(trainer, ckpt_dir, epoch + 1, history,
                                               config.output.keep_checkpoints, record)
        if trainer.stop_training:
            break

    # --- final models and metrics ---------------------------------------------------
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
    metrics: dict[str, EvalResult] = {}
    if val_ds is not None:
        steps = config.training.validation_steps
        metrics["raw"] = evaluate(raw_model, val_ds, class_names, steps=steps)
        if ema_model is not None:
            metrics["ema"] = evaluate(ema_model, val_ds, class_names, steps=steps)
    images_per_second = timed_images / timed_seconds if timed_seconds else float("nan")
    skipped = train_source.skipped.count
    if skipped:
        logger.warning(train_source.skipped.report())
    if chief:
        write_json(os.path.join(out, "metrics.json"), {
            "metrics": {k: v.to_dict() for k, v in metrics.items()},
            "history": history,
            "images_per_second": images_per_second,
            "skipped_images": skipped,
            **{k: run_info[k] for k in ("attention", "global_batch_size", "peak_lr",
                                        "precision")},
        })
    return TrainResult(
        history=history,
        output_dir=out,
        config_path=config_path,
        checkpoint_path=checkpoint_path,
        model_path=model_path if chief else None,
        ema_model_path=ema_model_path if chief else None,
        metrics=metrics,
        images_per_second=images_per_second,
        initial_epoch=initial_epoch,
        optimizer_step=int(optimizer.iterations.numpy()),
        global_batch_size=scaling.global_batch,
        learning_rate=peak_lr,
        num_replicas=scaling.replicas,
        precision=policy,
        attention=run_info["attention"],
        skipped_images=skipped,
        plan=plan,
    )


def finetune(
    config: TrainConfig | str | os.PathLike | dict,
    weights: str | os.PathLike,
    *,
    freeze_backbone: bool = False,
    new_head: bool = True,
    callbacks: Sequence[keras.callbacks.Callback] | None = None,
    replan: bool = False,
    on_plan: Callable[[RunPlan], None] | None = None,
) -> TrainResult:
    """Fine-tunes from pretrained weights with a new classifier for the config's data.

    Same as `train(config)` with `model.weights=weights`, `model.freeze_backbone` and
    `model.new_head` set: the backbone comes from an ml-cvnets / timm / HF checkpoint
    (ported by `load_torch_weights`) or a Keras `.weights.h5`, the classifier is new
    (sized for the data's classes) unless `new_head=False` and the sizes match.

    Args:
        config: as `train` (e.g. the packaged `finetune_small_data` recipe).
        weights: the pretrained weights file.
        freeze_backbone: train only the classifier; the frozen BatchNorms use their
            pretrained statistics.
        new_head: always start from a new classifier.
        callbacks: as `train`.
        replan: as `train`.
        on_plan: as `train`.
    """
    if not isinstance(config, TrainConfig):
        config = load_config(config)
    config = config.replace(model={"weights": os.fspath(weights),
                                   "freeze_backbone": freeze_backbone, "new_head": new_head})
    return train(config, callbacks=callbacks, replan=replan, on_plan=on_plan)
