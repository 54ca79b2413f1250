"""Exponential moving average (EMA) of model weights, kept apart from the raw weights."""

import contextlib
from collections.abc import Iterator, Sequence

import keras
import numpy as np
from keras import ops

from keras_mvit2.api_export import serializable


class _Untracked:
    """Holds references that Keras must not track (they belong to another layer)."""

    def __init__(self, items: Sequence):
        self.items = list(items)


@serializable
class ExponentialMovingAverage(keras.layers.Layer):
    """Shadow copies of a model's weights, averaged after every optimizer step.

    `ema = d * ema + (1 - d) * weight` with `d = decay`, or with `warmup=True`
    `d = min(decay, (1 + step) / (10 + step))`. Unlike `keras.optimizers.Optimizer(use_ema=True)`
    (whose `fit()` overwrites the model weights with the average at the end of every `fit`
    call), the raw weights are never touched: the average is evaluated by swapping it in
    (`swapped()`) and swapping back, and exported with `averaged_values()`.

    Every float weight of the tracked model is averaged, BatchNorm moving statistics
    included (as ml-cvnets and timm average the whole `state_dict`). The shadow weights
    are weights of this layer, so a checkpoint of a model that holds it (`save_weights`)
    stores them, and resuming restores the average. Under a `tf.distribute` strategy the
    shadows are created with `aggregation="only_first_replica"`: the update in replica
    context takes the (identical) value of replica 0.

    Args:
        decay: float in [0, 1). Weight of the old average (ml-cvnets' momentum 0.0005 is
            decay 0.9995).
        warmup: bool. Ramp the decay up with the step count.

    Example:
    ```python
    ema = ExponentialMovingAverage(0.999)
    ema.track(model.weights)          # once, after the weights are initialized / loaded
    ema.update(optimizer.iterations)  # after every optimizer step (inside the train step)
    with ema.swapped():
        model.evaluate(val_data)      # averaged weights
    ```
    """

    def __init__(self, decay: float = 0.9995, warmup: bool = False, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1). Received: decay={decay}")
        self.decay = float(decay)
        self.warmup = bool(warmup)
        self._targets = _Untracked([])
        self.shadows: list = []

    def track(self, variables: Sequence[keras.Variable]) -> None:
        """Creates one shadow per float variable, initialized to its current value."""
        if self.shadows:
            raise ValueError("This ExponentialMovingAverage already tracks variables.")
        targets = [v for v in variables if "float" in str(v.dtype)]
        if not targets:
            raise ValueError(f"No float variables to average. Received: {list(variables)}")
        shadows = []
        for i, v in enumerate(targets):
            shadows.append(
                self.add_weight(
                    shape=v.shape,
                    dtype=v.dtype,
                    initializer="zeros",
                    trainable=False,
                    aggregation="only_first_replica",
                    name=f"ema_{i}",
                )
            )
            # A copy: on JAX an assigned array is shared, and a train step that donates
            # its state's buffers must not meet one buffer twice.
            shadows[-1].assign(ops.copy(v.value))
        self.shadows = shadows
        self._targets = _Untracked(targets)
        self.built = True

    @property
    def targets(self) -> list:
        """The averaged model variables, in the order of `shadows`."""
        return self._targets.items

    def decay_at(self, step):
        """The decay used for the update after optimizer step `step` (1-based)."""
        if not self.warmup:
            return ops.convert_to_tensor(self.decay, "float32")
        step = ops.cast(step, "float32")
        return ops.minimum(self.decay, (1.0 + step) / (10.0 + step))

    def update(self, step=None) -> None:
        """One averaging step; `step` (the optimizer's iteration count) drives the warm-up."""
        if self.warmup and step is None:
            raise ValueError("ExponentialMovingAverage(warmup=True).update needs the step.")
        new = self.averaged([s.value for s in self.shadows], [v.value for v in self.targets],
                            step if step is not None else 0)
        for shadow, value in zip(self.shadows, new, strict=True):
            shadow.assign(value)

    def averaged(self, shadows: Sequence, values: Sequence, step) -> list:
        """The averages after one update, as a pure function of arrays (what `update`
        assigns): `shadows` the current averages, `values` the targets' values, in the order
        of `shadows` / `targets`; `step` drives the warm-up. For a compiled update
        (`jax.jit` on JAX, see `callbacks.EMAUpdate`)."""
        d = self.decay_at(step)
        return [ops.cast(d, shadow.dtype) * shadow
                + ops.cast(1.0 - d, shadow.dtype) * ops.cast(value, shadow.dtype)
                for shadow, value in zip(shadows, values, strict=True)]

    def swap(self) -> None:
        """Exchanges the averaged and the raw values (exact: no arithmetic)."""
        for shadow, v in zip(self.shadows, self.targets, strict=True):
            raw = ops.copy(v.value)
            v.assign(shadow.value)
            shadow.assign(raw)

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """Context in which the model holds the averaged weights; the raw ones come back after."""
        self.swap()
        try:
            yield
        finally:
            self.swap()

    def averaged_values(self) -> list[np.ndarray]:
        """The averages as numpy arrays, in the order of `targets`."""
        return [ops.convert_to_numpy(s.value) for s in self.shadows]

    def get_config(self):
        config = super().get_config()
        config.update({"decay": self.decay, "warmup": self.warmup})
        return config
