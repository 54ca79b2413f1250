"""The training model: `ClassifierTrainer`, a classifier wrapped for `fit`.

Its train step adds the recipe's gradient clipping on the global batch, the EMA update
after each optimizer step and the multi-scale train function (one trace for every
batch shape); `keras_mvit2.training.trainer.build_trainer` compiles one.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_mvit2.backend import keras_internals
from keras_mvit2.training.keras_trainer import ClassifierTrainerBase


class ClassifierTrainer(ClassifierTrainerBase):
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
    trace for every shape, as fast as one trace per shape with fewer traces
    (`benchmarks/results/training_throughput_multiscale.md`).

    Args:
        classifier: the (logits) classifier, built; for multi-scale, built for any size.
        multiscale: batches of several shapes (the multi-scale train function).
        ema: optional `ExponentialMovingAverage` tracking `classifier.weights`.
        clip_global_norm: optional float.
        example_batch: `(images, labels)` arrays with the shapes of a batch, used to build
            metrics without pulling a batch from the training data.
    """

    #: Multi-scale train function: True generalizes to one trace for every batch shape,
    #: False traces once per shape.
    reduce_retracing = True

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
                keras_internals.unscale_loss_for_distribution(loss),
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
        if not keras_internals.collective_all_reduce_multi_worker(self.distribute_strategy):
            return logs
        return {k: tf.reshape(v, [1]) if len(v.shape) == 0 else v for k, v in logs.items()}

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        iterator, data_batch = self._example_data(iterator, data_batch)
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
            return keras_internals.reduce_per_replica(outputs, strategy, reduction="auto")

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
