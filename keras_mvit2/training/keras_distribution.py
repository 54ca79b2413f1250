"""`training.strategy` on JAX and PyTorch: Keras' own distribution API instead of
`tf.distribute` (`keras_mvit2.training.distribute` picks one of the two).

- `default`: one device, no distribution.
- `mirrored`: `keras.distribution.DataParallel` over every local device on JAX (GPUs, TPU
  cores, or the CPU devices of `XLA_FLAGS=--xla_force_host_platform_device_count=N`): the
  weights are replicated, each batch is split along its first axis, and the gradient is the
  whole global batch's (one SPMD program), so the optimizer's `global_clipnorm` clips the
  global gradient as the TensorFlow train step does. Keras' distribution API runs on JAX
  only: on PyTorch it is refused. `train` runs inside `scope()` (Keras reads the
  distribution when `fit` runs); validation inside `fit` leaves out a last partial batch
  (`whole_batches`), the final evaluation runs on one device (`one_device`) over every image.
- `multi_worker`, `tpu`: TensorFlow's; refused here with the way out.

This module does not import TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import keras


@dataclasses.dataclass
class KerasDistribution:
    """The strategy of a run on JAX / PyTorch; what `train` needs of a `tf.distribute`
    strategy (`num_replicas_in_sync`, `scope()`).

    Attributes:
        name: the config's `training.strategy`.
        distribution: the `keras.distribution.Distribution`, None for one device.
    """

    name: str
    distribution: keras.distribution.Distribution | None = None

    @property
    def num_replicas_in_sync(self) -> int:
        """Devices the batch is split over (1 without distribution)."""
        if self.distribution is None:
            return 1
        return int(self.distribution.device_mesh.shape[0])

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """The distribution in effect (`keras.distribution.Distribution.scope`): models,
        optimizers and `fit` inside it are replicated / split over the devices."""
        if self.distribution is None:
            yield
            return
        with self.distribution.scope():
            yield

    @contextlib.contextmanager
    def one_device(self) -> Iterator[None]:
        """No distribution inside (models built there live on one device and take batches
        of any size), the previous one after."""
        previous = keras.distribution.distribution()
        keras.distribution.set_distribution(None)
        try:
            yield
        finally:
            keras.distribution.set_distribution(previous)

    def whole_batches(self, dataset: Any, num_examples: int, batch_size: int) -> Any:
        """`dataset` for validation inside `fit`: `DataParallel` splits every batch evenly
        over the devices, so the last batch, which does not fill `batch_size` (the global
        validation batch, a multiple of the devices) unless it divides `num_examples`, is
        left out (`take` of the full ones); one device: unchanged. The final metrics
        (`evaluate` on one device) count every image."""
        if self.num_replicas_in_sync == 1 or dataset is None:
            return dataset
        return dataset.take(max(1, num_examples // batch_size))

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the run's files: always (one host)."""
        return True


def make_keras_distribution(name: str, backend: str) -> KerasDistribution:
    """The `KerasDistribution` of a config's `training.strategy` on `backend`.

    Raises:
        ValueError: an unknown name, or one the backend does not run (the message names
            the backend and what to use instead).
    """
    if name == "default":
        return KerasDistribution(name)
    if name == "mirrored":
        if backend != "jax":
            raise ValueError(
                f"training.strategy 'mirrored' on the {backend!r} backend: Keras' distribution "
                "API (keras.distribution.DataParallel) runs on JAX only. Train on one device "
                "(--strategy default), or with KERAS_BACKEND=jax (DataParallel) or "
                "KERAS_BACKEND=tensorflow (tf.distribute.MirroredStrategy).")
        devices = keras.distribution.list_devices()
        return KerasDistribution(name, keras.distribution.DataParallel(devices=devices))
    if name in ("multi_worker", "tpu"):
        raise ValueError(
            f"training.strategy {name!r} is a tf.distribute strategy, which the {backend!r} "
            "backend does not run. Use KERAS_BACKEND=tensorflow for it, or --strategy "
            "mirrored (JAX: every local device) / default.")
    raise ValueError("strategy must be one of ('default', 'mirrored', 'multi_worker', 'tpu'). "
                     f"Received: strategy={name!r}")
