"""Every use of Keras' private modules (`keras.src`) in keras_mvit2, each behind one function.

Keras has no public form of these; the rest of the package calls the functions here and
imports nothing from `keras.src`, so a Keras upgrade that moves one of them is fixed here:

* `tensorflow_backend_ops`: Keras' TensorFlow backend ops on any backend (`EvalResizeCrop`
  inside a tf.data pipeline);
* `reduce_per_replica`, `collective_all_reduce_multi_worker`, `unscale_loss_for_distribution`:
  the pieces of Keras' TensorFlow train step that the recipe's own train step reuses;
* `torch_device`, `torch_device_scope`: the PyTorch backend's current device and its scope
  (the torch road exports on the CPU);
* `preserve_jax_x64_state`: Keras' guard of JAX's x64 setting around a converter import;
* `tensorflow_availability`: Keras' lazy `tensorflow` module, whose availability
  `keras_mvit2.backend.tensorflow_hidden_from_keras` turns off for a while.

Each function imports its module when called: importing this module imports nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

__all__ = [
    "collective_all_reduce_multi_worker",
    "preserve_jax_x64_state",
    "reduce_per_replica",
    "tensorflow_availability",
    "tensorflow_backend_ops",
    "torch_device",
    "torch_device_scope",
    "unscale_loss_for_distribution",
]


def tensorflow_backend_ops() -> tuple[ModuleType, ModuleType]:
    """`(core, numpy)`: the modules of Keras' TensorFlow backend that define the `keras.ops`
    names, usable on `tf.Tensor`s whatever backend Keras runs on (inside tf.data)."""
    from keras.src.backend import tensorflow as tensorflow_backend

    return tensorflow_backend.core, tensorflow_backend.numpy


def reduce_per_replica(values: Any, strategy: Any, reduction: str = "auto") -> Any:
    """Keras' TensorFlow trainer's reduction of a step's outputs over the replicas."""
    from keras.src.backend.tensorflow.trainer import reduce_per_replica as reduce

    return reduce(values, strategy, reduction=reduction)


def collective_all_reduce_multi_worker(strategy: Any) -> bool:
    """Whether `strategy` is a multi-worker collective all-reduce strategy (Keras' test)."""
    from keras.src.backend.tensorflow.trainer import _collective_all_reduce_multi_worker

    return _collective_all_reduce_multi_worker(strategy)


def unscale_loss_for_distribution(loss: Any) -> Any:
    """The loss as Keras' loss tracker records it: without the replicas' scaling."""
    from keras.src.losses import loss as loss_module

    return loss_module.unscale_loss_for_distribution(loss)


def torch_device() -> str:
    """The PyTorch backend's current device (``"cpu"``, ``"cuda"``, ...)."""
    from keras.src.backend.torch.core import get_device

    return get_device()


def torch_device_scope(device: str) -> contextlib.AbstractContextManager[Any]:
    """The PyTorch backend's scope placing new tensors on `device`."""
    from keras.src.backend.torch.core import device_scope

    return device_scope(device)


def preserve_jax_x64_state() -> contextlib.AbstractContextManager[Any]:
    """Keras' guard that restores JAX's ``jax_enable_x64`` after the block (litert-torch
    turns it on when imported)."""
    from keras.src.export.litert import _preserve_jax_x64_state

    return _preserve_jax_x64_state()


@contextlib.contextmanager
def tensorflow_availability(available: bool) -> Iterator[None]:
    """Within the block, Keras' lazy `tensorflow` module says TensorFlow is `available`
    (or not); restored afterwards."""
    from keras.src.utils import module_utils

    lazy = module_utils.tensorflow
    saved = lazy._available
    lazy._available = available
    try:
        yield
    finally:
        lazy._available = saved
