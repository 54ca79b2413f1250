"""Input pipelines (tf.data) and augmentation for training and evaluation.

Sources: `image_folder`, `tfrecords`, `tfds_source`, `fashion_mnist` -> `ImageSource`.
Pipelines: `make_train_dataset`, `make_eval_dataset`, `make_multiscale_train_dataset`.
Augmentation settings: `AugmentConfig`. Unreadable images are skipped and counted in
`source.skipped` (`SkippedImages`).
"""

# TensorFlow-only: on JAX / PyTorch, a clear error instead of loading TensorFlow.
from keras_mvit2.utils.backend import require_tensorflow

require_tensorflow("keras_mvit2.data (the tf.data input pipelines)")

from keras_mvit2.data.augment import (
    AugmentConfig,
    eval_transform,
    random_horizontal_flip,
    random_resized_crop,
)
from keras_mvit2.data.pipeline import (
    make_eval_dataset,
    make_multiscale_train_dataset,
    make_train_dataset,
    multiscale_batch_pairs,
    multiscale_steps_per_epoch,
    steps_per_epoch,
)
from keras_mvit2.data.sources import (
    FASHION_MNIST_CLASSES,
    ImageSource,
    SkippedImages,
    fashion_mnist,
    image_folder,
    load_fashion_mnist_arrays,
    tfds_source,
    tfrecords,
)

__all__ = [
    "FASHION_MNIST_CLASSES",
    "AugmentConfig",
    "ImageSource",
    "SkippedImages",
    "eval_transform",
    "fashion_mnist",
    "image_folder",
    "load_fashion_mnist_arrays",
    "make_eval_dataset",
    "make_multiscale_train_dataset",
    "make_train_dataset",
    "multiscale_batch_pairs",
    "multiscale_steps_per_epoch",
    "random_horizontal_flip",
    "random_resized_crop",
    "steps_per_epoch",
    "tfds_source",
    "tfrecords",
]
