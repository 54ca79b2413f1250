"""`tf.distribute` strategies (TensorFlow; Keras' distribution API on JAX and PyTorch:
`keras_distribution`), mixed precision and the batch / learning-rate scaling rule.

TensorFlow is imported by the functions that need it, on the TensorFlow backend only: this
module loads on PyTorch without it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import keras

from keras_mvit2.backend import keras_backend_name
from keras_mvit2.training.keras_distribution import KerasDistribution, make_keras_distribution

if TYPE_CHECKING:
    import tensorflow as tf

STRATEGIES = ("default", "mirrored", "multi_worker", "tpu")
PRECISIONS = ("auto", "float32", "mixed_float16", "mixed_bfloat16")


def make_strategy(name: str = "default", *,
                  tpu: str | None = None) -> tf.distribute.Strategy | KerasDistribution:
    """The `tf.distribute` strategy of a config's `training.strategy`.

    On JAX and PyTorch: the `KerasDistribution` of `keras_distribution.make_keras_distribution`
    (`mirrored` is `keras.distribution.DataParallel` on JAX).

    - `default`: no distribution (one device: the first GPU if any, else the CPU).
    - `mirrored`: `MirroredStrategy` over all local GPUs (or the CPU / logical CPUs),
      synchronous all-reduce.
    - `multi_worker`: `MultiWorkerMirroredStrategy`; every worker runs the same command
      with its own `TF_CONFIG`, e.g.
      `{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker",
      "index": 0}}`. Worker 0 (or the "chief") writes checkpoints, logs and models.
    - `tpu`: `TPUStrategy` over `TPUClusterResolver(tpu)`: `"local"` on a TPU VM, a TPU
      name or `grpc://` address, or `None` (TF's discovery: `TPU_NAME`, GCE metadata).

    Call it before anything else touches TensorFlow devices (multi-worker and TPU
    initialization must run first).

    Raises:
        ValueError: an unknown name, or `multi_worker` without a valid `TF_CONFIG`.
    """
    backend = keras_backend_name()
    if backend != "tensorflow":
        return make_keras_distribution(name, backend)
    import tensorflow as tf

    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    if name == "multi_worker":
        raw = os.environ.get("TF_CONFIG")
        if not raw:
            raise ValueError(
                "strategy 'multi_worker' needs the TF_CONFIG environment variable on every "
                'worker, e.g. TF_CONFIG=\'{"cluster": {"worker": ["10.0.0.1:12345", '
                '"10.0.0.2:12345"]}, "task": {"type": "worker", "index": 0}}\'. '
                "Received: TF_CONFIG unset"
            )
        try:
            spec = json.loads(raw)
            spec["cluster"], spec["task"]["type"], spec["task"]["index"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                "TF_CONFIG must be JSON with 'cluster' and 'task': {'type', 'index'}. "
                f"Received: TF_CONFIG={raw!r}"
            ) from None
        return tf.distribute.MultiWorkerMirroredStrategy()
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or None)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"strategy must be one of {STRATEGIES}. Received: strategy={name!r}")


def is_chief(strategy: tf.distribute.Strategy | KerasDistribution) -> bool:
    """Whether this process writes the run's files (worker 0 / the chief; always true alone)."""
    if isinstance(strategy, KerasDistribution):
        return strategy.is_chief
    import tensorflow as tf

    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type in (None, "chief"):
        return True
    cluster = resolver.cluster_spec().as_dict()
    return task_type == "worker" and task_id == 0 and "chief" not in cluster


@dataclass(frozen=True)
class Scaling:
    """Global batch and learning-rate factor for a number of replicas.

    Rule (linear scaling, Goyal et al. 2017): `global_batch = batch_per_replica * replicas`
    and every learning rate is multiplied by `lr_factor = global_batch / reference_batch`,
    the rates of a config being given for a global batch of `reference_batch` (1024 in the
    paper: 128 images x 8 GPUs). E.g. 8 GPUs x 128 -> lr 0.002; 1 GPU x 128 -> 0.00025.
    """

    replicas: int
    batch_per_replica: int
    global_batch: int
    reference_batch: int
    lr_factor: float


def scale_for_replicas(batch_per_replica: int, replicas: int, reference_batch: int) -> Scaling:
    """Applies the scaling rule (see `Scaling`)."""
    if batch_per_replica < 1 or replicas < 1 or reference_batch < 1:
        raise ValueError(
            "batch_per_replica, replicas and reference_batch must be >= 1. Received: "
            f"batch_per_replica={batch_per_replica}, replicas={replicas}, "
            f"reference_batch={reference_batch}"
        )
    global_batch = batch_per_replica * replicas
    return Scaling(replicas, batch_per_replica, global_batch, reference_batch,
                   global_batch / reference_batch)


def resolve_precision(precision: str, strategy: Any = None) -> str:
    """The Keras dtype policy for a config's `training.precision`.

    `auto`: `mixed_bfloat16` on TPUs and on GPUs of compute capability >= 8.0 (Ampere and
    newer), `mixed_float16` on GPUs >= 7.0 (Volta/Turing tensor cores), `float32` otherwise
    (on CPUs half precision is slower). On JAX and
    PyTorch the same rule reads the first accelerator's compute capability from the
    backend (`_keras_backend_capability`).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}. Received: {precision!r}")
    if precision != "auto":
        return precision
    if keras_backend_name() != "tensorflow":
        return _precision_for(_keras_backend_capability())
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "mixed_bfloat16"
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "float32"
    capabilities = []
    for gpu in gpus:
        details = tf.config.experimental.get_device_details(gpu)
        capabilities.append(tuple(details.get("compute_capability") or (0, 0)))
    return _precision_for(min(capabilities))


def _precision_for(capability: tuple[int, int] | str | None) -> str:
    """`auto`'s policy for a GPU compute capability, `"tpu"`, or None (no accelerator)."""
    if capability == "tpu":
        return "mixed_bfloat16"
    if capability is None:
        return "float32"
    if capability >= (8, 0):
        return "mixed_bfloat16"
    if capability >= (7, 0):
        return "mixed_float16"
    return "float32"


def _keras_backend_capability() -> tuple[int, int] | str | None:
    """JAX / PyTorch: the first GPU's compute capability, `"tpu"`, or None on CPUs."""
    backend = keras_backend_name()
    if backend == "torch":
        import torch

        return tuple(torch.cuda.get_device_capability(0)) if torch.cuda.is_available() else None
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        if device.platform == "tpu":
            return "tpu"
        if device.platform == "gpu":
            major, _, minor = str(getattr(device, "compute_capability", "0.0")).partition(".")
            return int(major), int(minor or 0)
    return None


class precision_policy:  # noqa: N801 (a context manager used like a function)
    """Context manager: sets Keras' global dtype policy, restores the previous one on exit."""

    def __init__(self, policy: str):
        self.policy = policy
        self._previous = None

    def __enter__(self) -> str:
        self._previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(self.policy)
        return self.policy

    def __exit__(self, *exc) -> None:
        keras.config.set_dtype_policy(self._previous)
