"""The backend's form of each TensorFlow-only step of the layers: chosen here, only here.

| Keras backend | module                            | why                                        |
|---------------|-----------------------------------|--------------------------------------------|
| `tensorflow`  | `keras_mvit2.layers.tf_forms`     | the ops TFLite / Core ML convert as pinned |
| `jax`, `torch`| `keras_mvit2.layers.ops_forms`    | the same functions in `keras.ops`          |

The layers (`functional`, `patching`, the MobileViT blocks, `EvalResizeCrop`) and the task
models' heads, losses and metrics (`keras_mvit2.tasks`) call the functions below, never
`tf_forms` or `ops_forms` directly, so TensorFlow's graph (and every exported file) is
exactly what `tf_forms` traces, and TensorFlow is not imported on the other backends. The
choice is made once, when this module is imported, from `keras.backend.backend()` (Keras
fixes the backend when it is imported: set `KERAS_BACKEND` before importing keras).

This is the second, independent choice of forms beside `keras_mvit2.layers.export_forms`
(which picks, per export target, among forms that all run on any backend).
"""

from __future__ import annotations

import keras

from keras_mvit2.layers import ops_forms  # keras.ops only: no TensorFlow, any backend

BACKEND: str = keras.backend.backend()
"""The Keras backend the forms were chosen for."""

if BACKEND == "tensorflow":
    from keras_mvit2.layers import tf_forms as _forms
else:
    _forms = ops_forms

#: The functions each form module defines (`ops_forms.__all__`), and `BACKEND`.
__all__ = ["BACKEND", *ops_forms.__all__]

space_to_depth = _forms.space_to_depth
depth_to_space = _forms.depth_to_space
depthwise_patch_conv = _forms.depthwise_patch_conv
conv1x1_nchw = _forms.conv1x1_nchw
matmul_transpose_a = _forms.matmul_transpose_a
batch_size = _forms.batch_size
spatial_size = _forms.spatial_size
resize_when_different = _forms.resize_when_different
resize_bilinear = _forms.resize_bilinear
resize_shorter_side = _forms.resize_shorter_side
argsort_stable = _forms.argsort_stable
