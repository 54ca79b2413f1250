"""The data of a run: the `ImageSource`s of `config.data`, the classes, the batch scaled
for the replicas (lowered to fit a training set smaller than one batch, `fit_batch_size`),
the multi-scale batches, and the datasets `train` fits and validates on.

The input is `tf.data` (`keras_mvit2.data` pipelines) on TensorFlow and JAX, and a
`keras.utils.PyDataset` read with numpy and PIL (`keras_mvit2.data.PyTrainBatches` /
`PyEvalBatches`) on PyTorch, which cannot load TensorFlow beside it
(`keras_mvit2.backend.variants`): image folders and Fashion-MNIST there,
with the standard augmentation (crop and flip; `keras_mvit2.data.py_augment` says how it
differs from the tf.data one).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from keras_mvit2 import data as mvdata
from keras_mvit2.backend import (
    TensorFlowBackendRequiredError,
    keras_backend_name,
    variants,
)
from keras_mvit2.training.config import TrainConfig
from keras_mvit2.training.distribute import Scaling, scale_for_replicas

if TYPE_CHECKING:
    import tensorflow as tf

#: Threads that read and augment an image folder's batches on PyTorch (PIL decodes and
#: resizes outside the GIL); arrays in memory are read in the training thread.
FOLDER_READER_THREADS = min(4, os.cpu_count() or 1)


def _limited(source: Any, limit: int | None) -> Any:
    if isinstance(source, mvdata.PySource):
        return source.limited(limit)
    if limit is None or limit >= source.num_examples:
        return source
    return dataclasses.replace(
        source,
        dataset=source.dataset.take(limit),
        num_examples=limit,
        make_records=None,
        decode_record=None,
        shuffle_records=False,
    )


def make_sources(config: TrainConfig) -> tuple[Any, Any]:
    """The training and validation sources of `config.data` (validation may be None):
    `ImageSource`s (tf.data) on TensorFlow and JAX, `PySource`s read with numpy / PIL on
    PyTorch (`keras_mvit2.backend.variants`)."""
    tf_data = variants().tf_data
    fashion_mnist = mvdata.fashion_mnist if tf_data else mvdata.py_fashion_mnist
    d = config.data
    if d.source == "fashion_mnist":
        train_kw = {} if d.train is None else {"data_dir": d.train}
        train = fashion_mnist(d.train_split, limit=d.train_limit, **train_kw)
        val = None
        if d.validation_split is not None:
            val_dir = d.validation or d.train
            val_kw = {} if val_dir is None else {"data_dir": val_dir}
            val = fashion_mnist(d.validation_split, limit=d.validation_limit, **val_kw)
        return train, val
    if not tf_data and d.source != "image_folder":
        raise TensorFlowBackendRequiredError(
            f"data.source {d.source!r} is read with tf.data, and TensorFlow cannot be loaded "
            f"beside Keras' {keras_backend_name()!r} backend. Train with "
            "KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow, or from an image folder "
            "(data.source: image_folder) or Fashion-MNIST, which every backend reads.")
    if d.source == "image_folder":
        image_folder = mvdata.image_folder if tf_data else mvdata.py_image_folder
        if d.validation is None and d.validation_fraction > 0:
            train = image_folder(d.train, split="training",
                                 validation_fraction=d.validation_fraction, seed=d.seed)
            _check_two_classes(train, d.train)  # before the split's own checks
            val = image_folder(d.train, split="validation",
                               validation_fraction=d.validation_fraction, seed=d.seed)
        else:
            train = image_folder(d.train)
            val = None if d.validation is None else image_folder(d.validation)
    elif d.source == "tfrecords":
        train = mvdata.tfrecords(d.train, class_names=d.class_names)
        val = None if d.validation is None else mvdata.tfrecords(
            d.validation, class_names=d.class_names)
    else:  # tfds
        train = mvdata.tfds_source(d.tfds_name, d.train_split, data_dir=d.train)
        val = None if d.validation_split is None else mvdata.tfds_source(
            d.tfds_name, d.validation_split, data_dir=d.validation or d.train)
    _check_two_classes(train, d.train)
    return _limited(train, d.train_limit), (
        None if val is None else _limited(val, d.validation_limit))


def _check_two_classes(source: Any, where: str | None) -> None:
    names = list(source.class_names)
    if len(names) < 2:
        raise ValueError(
            f"The training data {where!r} has {len(names)} class ({names}); a classifier "
            "needs at least two classes. For an image folder, put each class's images in its "
            "own sub-folder (DIR/<class>/*.jpg) with at least two sub-folders."
        )


def fit_batch_size(config: TrainConfig, num_examples: int,
                   replicas: int) -> tuple[TrainConfig, str | None]:
    """`config` with a `data.batch_size` that fits `num_examples` training images.

    A training set smaller than one global batch (`data.batch_size x replicas`: 15 photos
    against the recipe's 32, say) would give no full batch, so no training step. The batch
    per replica is then lowered to the most that fits, `num_examples // replicas` (every
    image in each epoch's one step), and a line says so. Anything else is left as it is.

    Returns:
        `(config, line)`: the config to train with (`data.batch_size` changed, or `config`
        itself) and the line to show, None when nothing changed.

    Raises:
        ValueError: fewer training images than replicas: no batch fits; the message names
            the ways out.
    """
    batch = config.data.batch_size
    if num_examples >= batch * replicas:
        return config, None
    fitted = num_examples // replicas
    if fitted < 1:
        raise ValueError(
            f"The training data ({num_examples} image(s)) has fewer images than the run has "
            f"replicas ({replicas}): no batch fits, even --set data.batch_size=1. Add images, "
            "or train on one replica (--strategy default).")
    per_replicas = f" x {replicas} replicas" if replicas > 1 else ""
    line = (f"data.batch_size {batch}{per_replicas} is more than the {num_examples} training "
            f"images: training with data.batch_size {fitted}{per_replicas}, one step per "
            f"epoch (--set data.batch_size=N picks another batch).")
    return config.replace(data={"batch_size": fitted}), line


@dataclasses.dataclass
class RunData:
    """What `train` knows of its data before it builds a model.

    Attributes:
        config: the run's `TrainConfig`.
        train_source, val_source: the `ImageSource`s, `PySource`s on PyTorch
            (`val_source` may be None).
        class_names: in label order, padded with `class_<i>` up to `num_classes`.
        num_classes: the classifier size (`model.num_classes` or the data's classes).
        scaling: the global batch and learning-rate factor for the replicas.
        eval_batch: the global validation batch.
        pairs: the multi-scale `(size, batch)` pairs, None without multi-scale.
        batch_line: the line saying the batch was lowered to fit the training set
            (`fit_batch_size`; `config` holds the lowered batch), None when it was not.
    """

    config: TrainConfig
    train_source: Any
    val_source: Any
    class_names: list[str]
    num_classes: int
    scaling: Scaling
    eval_batch: int
    pairs: list[tuple[int, int]] | None
    batch_line: str | None = None

    def train_dataset(self, epoch: int,
                      steps: int | None = None) -> tf.data.Dataset | mvdata.PyTrainBatches:
        """Epoch `epoch`'s batches (seed `data.seed + epoch`, repeated); on PyTorch a
        `PyTrainBatches` of `steps` batches (the epoch's steps)."""
        config, scaling = self.config, self.scaling
        size = config.model.image_size
        seed = config.data.seed + epoch
        if isinstance(self.train_source, mvdata.PySource):
            if steps is None:
                raise ValueError("A PyDataset epoch needs its number of steps. Received: None")
            return mvdata.PyTrainBatches(
                self.train_source, image_size=size, batch_size=scaling.global_batch,
                num_classes=self.num_classes, steps=steps, augment=config.augment, seed=seed,
                backend=keras_backend_name(), workers=self._reader_threads())
        if self.pairs:
            return mvdata.make_multiscale_train_dataset(
                self.train_source, base_size=size, base_batch_size=scaling.global_batch,
                num_classes=self.num_classes, scales=config.multiscale.scales,
                size_divisor=config.multiscale.size_divisor, batch_multiple=scaling.replicas,
                augment=config.augment, seed=seed, shuffle_buffer=config.data.shuffle_buffer,
                repeat=True)
        return mvdata.make_train_dataset(
            self.train_source, image_size=size, batch_size=scaling.global_batch,
            num_classes=self.num_classes, augment=config.augment, seed=seed,
            shuffle_buffer=config.data.shuffle_buffer, repeat=True)

    def _reader_threads(self) -> int:
        return 1 if self.config.data.source == "fashion_mnist" else FOLDER_READER_THREADS

    def validation_dataset(self) -> tf.data.Dataset | mvdata.PyEvalBatches | None:
        """The validation batches at the base size, None without validation data."""
        if self.val_source is None:
            return None
        config = self.config
        if isinstance(self.val_source, mvdata.PySource):
            return mvdata.PyEvalBatches(
                self.val_source, image_size=config.model.image_size,
                batch_size=self.eval_batch, num_classes=self.num_classes,
                crop_ratio=config.data.crop_ratio, workers=self._reader_threads())
        return mvdata.make_eval_dataset(self.val_source, image_size=config.model.image_size,
                                        batch_size=self.eval_batch,
                                        num_classes=self.num_classes,
                                        crop_ratio=config.data.crop_ratio)


def build_run_data(config: TrainConfig, replicas: int) -> RunData:
    """Reads the sources of `config.data` and sizes the classifier and batches for them
    (a batch larger than the training set is lowered: `fit_batch_size`; the returned
    `RunData.config` is the config to train with)."""
    train_source, val_source = make_sources(config)
    config, batch_line = fit_batch_size(config, train_source.num_examples, replicas)
    class_names = list(train_source.class_names)
    num_classes = config.model.num_classes or len(class_names)
    if num_classes < len(class_names):
        raise ValueError(
            f"model.num_classes={num_classes} is smaller than the {len(class_names)} classes "
            f"of the training data. Received: num_classes={num_classes}"
        )
    class_names += [f"class_{i}" for i in range(len(class_names), num_classes)]
    scaling = scale_for_replicas(config.data.batch_size, replicas,
                                 config.optimizer.reference_batch_size)
    eval_batch = (config.data.eval_batch_size or config.data.batch_size) * scaling.replicas
    pairs = None
    if config.multiscale.enabled:
        pairs = mvdata.multiscale_batch_pairs(
            config.model.image_size, scaling.global_batch, config.multiscale.scales,
            size_divisor=config.multiscale.size_divisor, batch_multiple=scaling.replicas)
    return RunData(config=config, train_source=train_source, val_source=val_source,
                   class_names=class_names, num_classes=num_classes, scaling=scaling,
                   eval_batch=eval_batch, pairs=pairs, batch_line=batch_line)
