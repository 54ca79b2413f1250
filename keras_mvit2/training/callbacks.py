"""The Keras callbacks `train` adds to every epoch's `fit`: EMA validation, throughput, and
on JAX / PyTorch the EMA update after each optimizer step."""

from __future__ import annotations

import time

import keras

from keras_mvit2.backend import keras_backend_name
from keras_mvit2.training.ema import ExponentialMovingAverage


class EMAUpdate(keras.callbacks.Callback):
    """Updates an `ExponentialMovingAverage` after every optimizer step (JAX, PyTorch).

    `KerasClassifierTrainer` trains with Keras' own train step; this callback does what
    `ClassifierTrainer.train_step` does after `optimizer.apply` on TensorFlow:
    `ema.update(optimizer.iterations)`, the step count already advanced. On JAX, reading
    `self.model` first writes the train function's state back into the variables
    (`jax_state_sync`) and the next step reads them again, the updated averages included.
    There the update is one compiled function of all the averages (`jax.jit` of
    `ExponentialMovingAverage.averaged`): op by op, JAX's eager dispatch costs about half a
    step. PyTorch runs it eagerly.

    Args:
        ema: the average, tracking the trained classifier's weights.
    """

    def __init__(self, ema: ExponentialMovingAverage):
        super().__init__()
        self.ema = ema
        self._compiled = None

    def on_train_batch_end(self, batch, logs=None):
        model = self.model  # JAX: syncs the step's state into the variables
        if keras_backend_name() != "jax":
            self.ema.update(model.optimizer.iterations)
            return
        if self._compiled is None:
            import jax

            self._compiled = jax.jit(self.ema.averaged)
        new = self._compiled([s.value for s in self.ema.shadows],
                             [v.value for v in self.ema.targets],
                             model.optimizer.iterations.value)
        for shadow, value in zip(self.ema.shadows, new, strict=True):
            shadow.assign(value)


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
