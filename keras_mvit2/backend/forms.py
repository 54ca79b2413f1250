"""The backend's form of each TensorFlow-only step of the layers: chosen here, only here.

| Keras backend | module                             | why                                        |
|---------------|------------------------------------|--------------------------------------------|
| `tensorflow`  | `keras_mvit2.backend.tf_forms`     | the ops TFLite / Core ML convert as pinned |
| `jax`, `torch`| `keras_mvit2.backend.ops_forms`    | the same functions in `keras.ops`          |

The layers (`functional`, `patching`, the MobileViT blocks, `EvalResizeCrop`) and the task
models' heads, losses and metrics (`keras_mvit2.tasks`) call the functions below, never
`tf_forms` or `ops_forms` directly, so TensorFlow's graph (and every exported file) is
exactly what `tf_forms` traces, and TensorFlow is not imported on the other backends. The
choice is made once, when this module is imported, from the Keras backend
(`keras_mvit2.backend.keras_backend_name`; Keras fixes the backend when it is imported: set
`KERAS_BACKEND` before importing keras). `tf_data_forms` gives the TensorFlow form on any
backend, for a layer that runs inside a tf.data pipeline.

This is the second, independent choice of forms beside `keras_mvit2.layers.export_forms`
(which picks, per export target, among forms that all run on any backend).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from keras_mvit2.backend import ops_forms  # imports Keras (which fixes its backend), no TF
from keras_mvit2.backend.policy import keras_backend_name

BACKEND: str = keras_backend_name()
"""The Keras backend the forms were chosen for."""

if BACKEND == "tensorflow":
    from keras_mvit2.backend import tf_forms as _forms
else:
    _forms = ops_forms

#: The functions each form module defines (`ops_forms.__all__`), `BACKEND` and
#: `tf_data_forms`.
__all__ = ["BACKEND", *ops_forms.__all__, "tf_data_forms"]

space_to_depth = _forms.space_to_depth
depth_to_space = _forms.depth_to_space
depthwise_patch_conv = _forms.depthwise_patch_conv
conv1x1_nchw = _forms.conv1x1_nchw
matmul_transpose_a = _forms.matmul_transpose_a
matmul_transpose_b = _forms.matmul_transpose_b
batch_size = _forms.batch_size
spatial_size = _forms.spatial_size
resize_when_different = _forms.resize_when_different
resize_bilinear = _forms.resize_bilinear
resize_shorter_side = _forms.resize_shorter_side
argsort_stable = _forms.argsort_stable


def tf_data_forms() -> tuple[Any, Callable[..., Any]]:
    """`(xp, resize_shorter_side)` for `tf.Tensor`s inside a tf.data pipeline, whatever
    Keras' backend: `xp` has the `keras.ops` names of Keras' TensorFlow backend (a layer
    call would convert the inputs to the backend's tensors, which a tf.data graph cannot),
    and `resize_shorter_side` is `tf_forms`' computed with them. Imports TensorFlow."""
    from keras_mvit2.backend import tf_forms
    from keras_mvit2.backend.keras_internals import tensorflow_backend_ops

    xp = _Ops(*tensorflow_backend_ops())
    return xp, functools.partial(tf_forms.resize_shorter_side, xp=xp)


class _Ops:
    """The `keras.ops` names taken from the given backend modules (in order)."""

    def __init__(self, *modules: Any):
        self._modules = modules

    def __getattr__(self, name: str) -> Any:
        for module in self._modules:
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(name)
