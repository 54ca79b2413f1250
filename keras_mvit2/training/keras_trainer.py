"""The training model on JAX and PyTorch: `KerasClassifierTrainer`, a classifier wrapped for
Keras' own train step (the TensorFlow backend keeps `train_step.ClassifierTrainer`).

Keras 3 has no backend-neutral way to change a train step, so the recipe's two additions
use what Keras offers on every backend, with the same numbers as the TensorFlow step on
one device:

- gradient clipping: the optimizer's `global_clipnorm` (`tf.clip_by_global_norm`'s
  formula; under JAX's `DataParallel` the gradient is already the global batch's);
- EMA: `callbacks.EMAUpdate` updates this trainer's `ExponentialMovingAverage` after every
  optimizer step. Keras' `Optimizer(use_ema=True)` is not used: it averages the trainable
  weights only, has no decay warm-up, and `fit` overwrites the model's weights with the
  average at the end of every call.

Multi-scale training runs on JAX (one compiled step per batch shape, counted per shape as
on TensorFlow); PyTorch's numpy batches have one size, so `build_trainer` refuses it there.
"""
from __future__ import annotations

import collections

import keras
import numpy as np
from keras import ops

from keras_mvit2.training.ema import ExponentialMovingAverage, _Untracked


class ClassifierTrainerBase(keras.Model):
    """What both trainers hold (`KerasClassifierTrainer` here, `train_step.ClassifierTrainer`
    on TensorFlow): the classifier, whether it trains on batches of several shapes, its
    EMA, the clipping norm, an example batch to build the metrics from, the batch shapes
    seen, and the call (float32 logits).
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
        self._multiscale = multiscale
        self.ema = ema
        self.clip_global_norm = clip_global_norm
        self._example_batch = _Untracked(list(example_batch) if example_batch else [])
        self._batch_shapes = _Untracked([collections.Counter()])
        self.built = True

    @property
    def multiscale(self) -> bool:
        """Batches of several shapes (multi-scale training)."""
        return self._multiscale

    @property
    def batch_shapes(self) -> collections.Counter:
        """Multi-scale mode: training steps run per (replica-local) image batch shape."""
        return self._batch_shapes.items[0]

    def call(self, inputs, training=None):
        logits = self.classifier(inputs, training=training)
        return ops.cast(logits, "float32")  # loss and metrics in float32 under mixed precision

    def _example_data(self, iterator, data_batch):
        """`(iterator, data_batch)` for Keras' metric build, which pulls a batch from the
        training data (another pass, another shuffle): the example batch when there is one."""
        if data_batch is None and self._example_batch.items:
            return None, tuple(self._example_batch.items)
        return iterator, data_batch


class KerasClassifierTrainer(ClassifierTrainerBase):
    """Wraps a classifier for `fit` with Keras' own train step (JAX, PyTorch).

    The interface of `train_step.ClassifierTrainer` that `train` uses: `classifier`, `ema`
    (a tracked layer, so `save_weights` checkpoints hold the average), `clip_global_norm`
    (applied by the optimizer's `global_clipnorm`), `multiscale` (JAX only),
    `batch_shapes`, and `step_callbacks()`, the callbacks every `fit` needs (the EMA
    update).

    Args:
        classifier: the (logits) classifier, built (for multi-scale, for any size).
        multiscale: batches of several shapes (JAX: one compiled step per shape).
        ema: optional `ExponentialMovingAverage` tracking `classifier.weights`.
        clip_global_norm: the global norm the optimizer clips to (recorded; set the
            optimizer's `global_clipnorm` to it).
        example_batch: `(images, labels)` arrays with the shapes of a batch, used to build
            the metrics without pulling a batch from the training data.
    """

    def make_train_function(self, force=False):
        made = super().make_train_function(force)
        function = self.train_function
        if not self.multiscale or getattr(function, "_counts_shapes", False):
            return made

        def counted(state, iterator):  # JAX: an iterator of the execution's one batch
            data = next(iterator)
            self.batch_shapes[tuple(keras.tree.flatten(data)[0].shape)] += 1
            return function(state, iter((data,)))

        counted._counts_shapes = True
        self.train_function = counted
        return made

    def step_callbacks(self) -> list[keras.callbacks.Callback]:
        """The callbacks each `fit` of this trainer needs: the EMA update, if any."""
        from keras_mvit2.training.callbacks import EMAUpdate

        return [] if self.ema is None else [EMAUpdate(self.ema)]

    def _symbolic_build(self, iterator=None, data_batch=None):
        iterator, data_batch = self._example_data(iterator, data_batch)
        return super()._symbolic_build(iterator=iterator, data_batch=data_batch)

