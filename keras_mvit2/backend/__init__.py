"""The backend seam: which Keras backend runs, what runs on it, and what differs there.

The models, layers and task models run on every Keras backend (TensorFlow, JAX, PyTorch).
What differs by backend is decided in this package, and only here:

| backend      | layers' TF-only steps | input (`data`)     | train step (`training`)  |
|--------------|-----------------------|--------------------|--------------------------|
| `tensorflow` | `tf_forms`            | tf.data            | `ClassifierTrainer`      |
| `jax`        | `ops_forms`           | tf.data (1)        | `KerasClassifierTrainer` |
| `torch`      | `ops_forms`           | numpy / PIL `py_*` | `KerasClassifierTrainer` |

(1) TensorFlow runs only the input pipeline there.

* `policy`: `keras_backend_name` (the one place the backend is read, without importing
  Keras), `variants` (the input and train-step variants of the table), the guards of the
  TensorFlow-only parts (`require_tensorflow`, `lazy_attributes`,
  `TensorFlowBackendRequiredError`) and where TensorFlow may be loaded beside the backend
  (`tensorflow_loadable`, `tensorflow_hidden_from_keras`: on this stack a PyTorch
  convolution crashes in a process that has imported TensorFlow).
* `forms`: the backend's form of each TensorFlow-only step of the layers (`tf_forms` on
  TensorFlow, `ops_forms` in `keras.ops` elsewhere); layers and models reach them only
  through `forms`.
* `keras_internals`: every use of Keras' private modules (`keras.src`), one function each.
* `child`: the one child-process runner (the phone-files export off TensorFlow, the TFMOT
  worker of `keras_mvit2.quantize`).

The TensorFlow-only parts, which raise `TensorFlowBackendRequiredError` on the backends
named: the TFLite / Core ML / web export's TensorFlow road (`keras_mvit2.export`: on JAX the
whole package; on PyTorch the torch road runs), quantization (`keras_mvit2.quantize`), the
profiler, the task models' training and data (`keras_mvit2.tasks.train`,
`keras_mvit2.tasks.data`; the task models, their losses and metrics run everywhere) and,
on PyTorch, the tf.data names of `keras_mvit2.data`. On JAX and PyTorch they say so when
used instead of loading TensorFlow beside the backend.

Importing this package (and `policy`, `keras_internals`, `child`) imports neither Keras nor
TensorFlow; `forms` imports Keras, and TensorFlow on the TensorFlow backend.
"""

from keras_mvit2.backend.policy import (
    TensorFlowBackendRequiredError,
    Variants,
    keras_backend_name,
    lazy_attributes,
    require_tensorflow,
    tensorflow_hidden_from_keras,
    tensorflow_loadable,
    variants,
)

__all__ = [
    "TensorFlowBackendRequiredError",
    "Variants",
    "keras_backend_name",
    "lazy_attributes",
    "require_tensorflow",
    "tensorflow_hidden_from_keras",
    "tensorflow_loadable",
    "variants",
]
