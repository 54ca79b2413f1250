"""Input pipelines and augmentation for training and evaluation.

tf.data (TensorFlow and JAX): sources `image_folder`, `tfrecords`, `tfds_source`,
`fashion_mnist` -> `ImageSource`; pipelines `make_train_dataset`, `make_eval_dataset`,
`make_multiscale_train_dataset`. Unreadable images are skipped and counted in
`source.skipped` (`SkippedImages`).

Without TensorFlow (every backend; the PyTorch backend's input): sources `py_image_folder`,
`py_fashion_mnist` -> `PySource`; batches `PyTrainBatches`, `PyEvalBatches`
(`keras.utils.PyDataset`s, the standard augmentation in numpy / PIL: `py_augment`).

Augmentation settings: `AugmentConfig`. On PyTorch, which cannot load TensorFlow beside it,
the tf.data names raise `TensorFlowBackendRequiredError`; the others work.
"""

from keras_mvit2.backend import require_tensorflow, variants
from keras_mvit2.data.augment_config import AugmentConfig
from keras_mvit2.data.batching import (
    multiscale_batch_pairs,
    multiscale_steps_per_epoch,
    steps_per_epoch,
)
from keras_mvit2.data.files import (
    FASHION_MNIST_CLASSES,
    list_image_folder,
    load_fashion_mnist_arrays,
)
from keras_mvit2.data.py_sources import PySource, SkippedFiles, py_fashion_mnist, py_image_folder

#: The tf.data names: imported on TensorFlow and JAX; on PyTorch their use raises.
_TF_DATA = {
    "ImageSource": "sources",
    "SkippedImages": "sources",
    "fashion_mnist": "sources",
    "image_folder": "sources",
    "tfds_source": "sources",
    "tfrecords": "sources",
    "eval_transform": "augment",
    "random_horizontal_flip": "augment",
    "random_resized_crop": "augment",
    "make_eval_dataset": "pipeline",
    "make_multiscale_train_dataset": "pipeline",
    "make_train_dataset": "pipeline",
}

if variants().tf_data:  # keras_mvit2.backend.variants: not on PyTorch
    from keras_mvit2.data.augment import (
        eval_transform,
        random_horizontal_flip,
        random_resized_crop,
    )
    from keras_mvit2.data.pipeline import (
        make_eval_dataset,
        make_multiscale_train_dataset,
        make_train_dataset,
    )
    from keras_mvit2.data.sources import (
        ImageSource,
        SkippedImages,
        fashion_mnist,
        image_folder,
        tfds_source,
        tfrecords,
    )

__all__ = [
    "FASHION_MNIST_CLASSES",
    "AugmentConfig",
    "ImageSource",
    "PyEvalBatches",
    "PySource",
    "PyTrainBatches",
    "SkippedFiles",
    "SkippedImages",
    "eval_transform",
    "fashion_mnist",
    "image_folder",
    "list_image_folder",
    "load_fashion_mnist_arrays",
    "make_eval_dataset",
    "make_multiscale_train_dataset",
    "make_train_dataset",
    "multiscale_batch_pairs",
    "multiscale_steps_per_epoch",
    "py_fashion_mnist",
    "py_image_folder",
    "random_horizontal_flip",
    "random_resized_crop",
    "steps_per_epoch",
    "tfds_source",
    "tfrecords",
]

if not variants().tf_data:  # `from keras_mvit2.data import *` loads no TensorFlow
    __all__ = [name for name in __all__ if name not in _TF_DATA]


#: `keras.utils.PyDataset` subclasses, imported on first use: a process whose `keras` has no
#: PyDataset (the QAT worker's tf_keras) still imports this package.
_PY_DATASET = ("PyEvalBatches", "PyTrainBatches")


def __getattr__(name: str):
    if name in _PY_DATASET:
        from keras_mvit2.data import py_dataset

        return getattr(py_dataset, name)
    if name in _TF_DATA:  # only reached where TensorFlow may not be loaded
        require_tensorflow(f"keras_mvit2.data.{name} (the tf.data input pipelines)")
    raise AttributeError(f"module 'keras_mvit2.data' has no attribute {name!r}")
