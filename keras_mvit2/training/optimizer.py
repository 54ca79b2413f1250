"""The optimizer and the schedule a run wants: AdamW / SGD with decoupled weight decay,
and the length (steps per epoch, warm-up) and learning rates scaled for the replicas
(`plan_schedule`, the `SchedulePlan` the run folder is checked against)."""

from __future__ import annotations

from collections.abc import Sequence

import keras

from keras_mvit2 import data as mvdata
from keras_mvit2.training.config import TrainConfig
from keras_mvit2.training.distribute import Scaling
from keras_mvit2.training.run_data import RunData
from keras_mvit2.training.run_folder import SchedulePlan, plan_fields


def make_optimizer(config: TrainConfig, schedule, trainable: Sequence[keras.Variable],
                   precision: str, *,
                   global_clipnorm: float | None = None) -> keras.optimizers.Optimizer:
    """AdamW / SGD on `schedule`, no weight decay on 1-D weights, loss scaling for fp16.

    `global_clipnorm`: Keras' own clipping of the global gradient norm (the JAX / PyTorch
    trainer's; the TensorFlow train step clips the all-reduced gradient itself).
    """
    o = config.optimizer
    if o.name == "adamw":
        optimizer = keras.optimizers.AdamW(
            learning_rate=schedule, weight_decay=o.weight_decay, beta_1=o.beta1,
            beta_2=o.beta2, epsilon=o.epsilon, global_clipnorm=global_clipnorm,
        )
    else:
        optimizer = keras.optimizers.SGD(
            learning_rate=schedule, momentum=o.momentum, nesterov=o.nesterov,
            weight_decay=o.weight_decay or None, global_clipnorm=global_clipnorm,
        )
    if o.no_decay_1d and o.weight_decay:
        optimizer.exclude_from_weight_decay(var_list=[v for v in trainable if len(v.shape) <= 1])
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(list(trainable))
    return optimizer


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
            f"{scaling.replicas} replicas). Use a smaller batch: --set data.batch_size="
            f"{max(1, num_examples // scaling.replicas)} on the command line (data.batch_size "
            f"in the config). Received: batch_size={scaling.batch_per_replica}"
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


def plan_schedule(config: TrainConfig, data: RunData) -> SchedulePlan:
    """The length and learning-rate schedule `config` asks for on `data`'s replicas."""
    scaling = data.scaling
    steps_per_epoch = _steps_per_epoch(config, data.train_source.num_examples, scaling,
                                       data.pairs)
    warmup_steps = _warmup_steps(config, steps_per_epoch,
                                 steps_per_epoch * config.training.epochs)
    peak_lr = config.optimizer.lr * scaling.lr_factor
    min_lr = peak_lr if config.schedule.name == "constant" else (
        config.schedule.min_lr * scaling.lr_factor)
    return SchedulePlan(
        epochs=config.training.epochs, steps_per_epoch=steps_per_epoch,
        warmup_steps=warmup_steps, peak_lr=peak_lr, min_lr=min_lr,
        warmup_init_lr=config.schedule.warmup_init_lr * scaling.lr_factor,
        schedule=config.schedule.name, fields=plan_fields(config))
