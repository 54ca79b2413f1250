"""Quantization-aware training, pruning and weight clustering of Keras 3 models.

* `qat`: quantization-aware training of the post-training full-int8 file's own graph
  (`keras_mvit2.quantize.tflite_graph`), in this process; it writes the trained file only
  where an exact paired test on images it did not train on chooses it
  (`keras_mvit2.quantize.agreement`), else the post-training one.
* `prune` / `cluster`: magnitude pruning and weight clustering of the conv / dense kernels
  with TensorFlow Model Optimization. TFMOT only works on tf_keras models and must not be
  imported in a Keras 3 process (it sets ``TF_USE_LEGACY_KERAS=1``), so they run in a
  worker process on a tf_keras twin built from the same keras_mvit2 layer code (weights
  transferred by variable path and checked on real images) and give back Keras 3 models.

Importing this package imports neither TFMOT nor tf_keras.
"""

# TensorFlow-only: on JAX / PyTorch, a clear error instead of loading TensorFlow.
from keras_mvit2.backend import require_tensorflow

require_tensorflow("keras_mvit2.quantize (quantization-aware training, pruning, clustering)")

from keras_mvit2.quantize._worker_client import QuantizationWorkerError
from keras_mvit2.quantize.qat import IO_DTYPES, QATResult, qat
from keras_mvit2.quantize.sparsity import SparsityResult, cluster, exported_kernel_stats, prune
from keras_mvit2.quantize.tf_keras_twin import TwinError

__all__ = [
    "IO_DTYPES",
    "QATResult",
    "QuantizationWorkerError",
    "SparsityResult",
    "TwinError",
    "cluster",
    "exported_kernel_stats",
    "prune",
    "qat",
]
