"""The epochs of a run: the callbacks of every `fit`, one `fit` call per epoch, the
divergence check after it and the checkpoint written after each epoch."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

import keras

from keras_mvit2.backend import keras_backend_name, tensorflow_loadable
from keras_mvit2.training.callbacks import _EMAValidation, _Throughput
from keras_mvit2.training.checkpoints import TrainingState, _save_checkpoint
from keras_mvit2.training.config import TrainConfig
from keras_mvit2.training.divergence import (
    StopOnNonFiniteLoss,
    diverged_error,
    non_finite_weights,
)
from keras_mvit2.training.run_data import RunData
from keras_mvit2.training.run_folder import RunPlan, SchedulePlan, checkpoint_record
from keras_mvit2.utils.progress import EpochProgress, progress_verbose

if TYPE_CHECKING:
    import tensorflow as tf

    from keras_mvit2.training.keras_trainer import KerasClassifierTrainer
    from keras_mvit2.training.train_step import ClassifierTrainer

logger = logging.getLogger("keras_mvit2.training")


def _tensorboard_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def make_callbacks(
    config: TrainConfig,
    trainer: ClassifierTrainer | KerasClassifierTrainer,
    val_ds: tf.data.Dataset | keras.utils.PyDataset | None,
    throughput: _Throughput,
    user_callbacks: list,
    out: str,
    chief: bool,
) -> tuple[list, StopOnNonFiniteLoss, int]:
    """The callbacks of every epoch's `fit`, the divergence stop among them, and the
    progress verbosity (0 on workers other than the chief)."""
    # JAX / PyTorch: the EMA update after each optimizer step (`KerasClassifierTrainer`).
    callbacks: list = list(getattr(trainer, "step_callbacks", list)())
    if trainer.ema is not None and val_ds is not None:
        callbacks.append(_EMAValidation(trainer.ema, val_ds, config.training.validation_steps))
    callbacks.append(throughput)
    if config.output.tensorboard and chief:
        if not tensorflow_loadable():
            logger.warning("output.tensorboard is on, but Keras' TensorBoard callback writes "
                           "with TensorFlow, which cannot be loaded beside the %r backend: no "
                           "TensorBoard logs (metrics.json holds the history).",
                           keras_backend_name())
        elif _tensorboard_available():
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
    return callbacks, stop_on_non_finite, verbose


def _check_finite(stop: StopOnNonFiniteLoss,
                  trainer: ClassifierTrainer | KerasClassifierTrainer, epoch: int,
                  config: TrainConfig, policy: str, state: TrainingState) -> None:
    """Raises `TrainingDivergedError` when the epoch's loss or a weight is not finite."""
    bad = [] if stop.batch is not None else non_finite_weights(trainer.classifier.weights)
    if stop.batch is not None or bad:
        raise diverged_error(
            epoch=epoch + 1,
            batch=None if stop.batch is None else stop.batch + 1,
            loss=stop.loss, bad_weights=bad, last_checkpoint=state.checkpoint_path,
            lr=config.optimizer.lr, clip_global_norm=config.optimizer.clip_global_norm,
            precision=policy)


def fit_epochs(
    config: TrainConfig,
    trainer: ClassifierTrainer | KerasClassifierTrainer,
    data: RunData,
    val_ds: tf.data.Dataset | keras.utils.PyDataset | None,
    plan: RunPlan,
    wanted: SchedulePlan,
    *,
    policy: str,
    user_callbacks: list,
    out: str,
    chief: bool,
    state: TrainingState,
) -> None:
    """Runs the epochs from `state.initial_epoch` to `training.epochs`, one `fit` each,
    adding each epoch to `state` and (on the chief) writing its checkpoint."""
    throughput = _Throughput(data.scaling.global_batch)
    callbacks, stop, verbose = make_callbacks(config, trainer, val_ds, throughput,
                                              user_callbacks, out, chief)
    schedule = plan.learning_rate
    record = checkpoint_record(wanted, schedule)
    ckpt_dir = os.path.join(out, "checkpoints")
    every = config.training.validate_every
    for epoch in range(state.initial_epoch, config.training.epochs):
        validate = val_ds is not None and every > 0 and (
            (epoch + 1) % every == 0 or epoch + 1 == config.training.epochs)
        start = time.perf_counter()
        fit = trainer.fit(
            data.train_dataset(epoch, steps=wanted.steps_per_epoch),
            epochs=epoch + 1,
            initial_epoch=epoch,
            steps_per_epoch=wanted.steps_per_epoch,
            validation_data=val_ds if validate else None,
            validation_steps=config.training.validation_steps if validate else None,
            callbacks=callbacks,
            verbose=verbose,
            shuffle=False,
        )
        seconds = time.perf_counter() - start
        _check_finite(stop, trainer, epoch, config, policy, state)
        ips, images, timed = throughput.images_per_second()
        state.timed_images += images
        state.timed_seconds += timed
        step = int(trainer.optimizer.iterations.numpy())
        entry = {"epoch": epoch + 1, "step": step,
                 "learning_rate": float(schedule(step - 1)),
                 "seconds": seconds, "images_per_second": ips}
        entry.update({k: float(v[-1]) for k, v in fit.history.items()})
        state.history.append(entry)
        if chief:
            state.checkpoint_path = _save_checkpoint(trainer, ckpt_dir, epoch + 1,
                                                     state.history,
                                                     config.output.keep_checkpoints, record)
        if trainer.stop_training:
            break
