"""`training.deterministic`: deterministic kernels on one thread, without oneDNN, and the
environment (`DETERMINISTIC_ENV`) a process needs for bitwise-reproducible runs."""

from __future__ import annotations

import logging
import os

from keras_mvit2.backend import keras_backend_name

logger = logging.getLogger("keras_mvit2.training")


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

    `enable_op_determinism` is not enough on a CPU: with several threads, or with
    oneDNN's kernels, runs on a loaded CPU now and then round differently. What can no
    longer be set here (TensorFlow reads it when it loads) is named in a warning that says
    how to start the process instead (`DETERMINISTIC_ENV`).

    On JAX the CPU kernels XLA compiles are deterministic as they are; on PyTorch,
    `torch.use_deterministic_algorithms(True)` (`_make_deterministic_keras_backend`).
    """
    if keras_backend_name() != "tensorflow":
        _make_deterministic_keras_backend()
        return
    import tensorflow as tf

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


def _make_deterministic_keras_backend() -> None:
    """`training.deterministic` on JAX / PyTorch (TensorFlow is not loaded there).

    PyTorch: deterministic algorithms only (an op without one raises). JAX: nothing to set
    on CPUs (XLA's CPU programs are deterministic); on GPUs, XLA's deterministic ops flag
    is read when JAX starts, so a warning names it when it is missing.
    """
    backend = keras_backend_name()
    if backend == "torch":
        import torch

        torch.use_deterministic_algorithms(True)
    elif backend == "jax":
        import jax

        if (jax.devices()[0].platform == "gpu"
                and "--xla_gpu_deterministic_ops=true" not in os.environ.get("XLA_FLAGS", "")):
            logger.warning("training.deterministic on a GPU with JAX: start the process with "
                           "XLA_FLAGS=--xla_gpu_deterministic_ops=true for bitwise-"
                           "reproducible runs.")

