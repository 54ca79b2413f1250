"""Image sources: image folders, TFRecord shards, TFDS datasets and Fashion-MNIST.

Every source is an `ImageSource`: an unbatched `tf.data.Dataset` of `(image, label)` plus
its size, class names and a `SkippedImages` counter. `make_train_dataset` /
`make_eval_dataset` (in `keras_mvit2.data.pipeline`) turn a source into batches.

Unreadable images (truncated JPEGs, garbage bytes, a text file named `x.jpg`) never stop a
run: the pipelines decode each image inside a guard (`keras_mvit2.data.pipeline.guarded_decode`)
that drops it and records its name (the file path, `shard#record`, the TFDS id, or `#index`)
in `source.skipped`; read `source.skipped.count` and `source.skipped.report()` after (or
during) iteration. Files are not pre-validated: that would cost a full decode pass first.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from keras_mvit2.data.files import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_DIR,
    _limited_fashion_mnist,
    _skipped_report,
    list_image_folder,
)


class SkippedImages:
    """Counts the unreadable images that the pipelines dropped, by name.

    Names are file paths for image folders, `shard#record` for TFRecords, the TFDS id for
    TFDS, and `#index` (position in `source.dataset`) otherwise. The same image failing again
    in a later epoch is counted once in `count` and again in `events`.

    Args:
        where: str. What the source reads, for the report (e.g. "image folder '/data'").
    """

    def __init__(self, where: str = "the data source"):
        self.where = where
        with tf.init_scope(), tf.device("/CPU:0"):
            self._table = tf.lookup.experimental.MutableHashTable(
                key_dtype=tf.string, value_dtype=tf.int64, default_value=0
            )

    def record(self, name: tf.Tensor) -> tf.Tensor:
        """Graph op: counts one failure of `name` (a scalar string). Returns the new count."""
        new = self._table.lookup(name) + 1
        with tf.control_dependencies([self._table.insert(name, new)]):
            return tf.identity(new)

    @property
    def count(self) -> int:
        """Number of distinct unreadable images seen so far."""
        return int(self._table.size().numpy())

    @property
    def events(self) -> int:
        """Number of times an unreadable image was dropped (over all epochs)."""
        _, values = self._table.export()
        return int(tf.reduce_sum(values).numpy())

    def names(self) -> list[str]:
        """Sorted names of the unreadable images seen so far."""
        keys, _ = self._table.export()
        return sorted(k.decode("utf-8", "replace") for k in keys.numpy().tolist())

    def reset(self) -> None:
        """Forgets everything counted so far."""
        keys, _ = self._table.export()
        self._table.remove(keys)

    def report(self, max_names: int = 5) -> str:
        """One message with the count and the first `max_names` names."""
        return _skipped_report(self, max_names, "drop")

    def __repr__(self) -> str:
        return f"SkippedImages(where={self.where!r}, count={self.count})"


@dataclasses.dataclass
class ImageSource:
    """A labelled image source.

    Attributes:
        dataset: unbatched `tf.data.Dataset` of `(image, label)`: `image` is encoded bytes
            (tf.string, JPEG/PNG/GIF/BMP) or a decoded uint8 `(H, W, C)` tensor with C in
            {1, 3}; `label` is an int32 scalar in `[0, len(class_names))`.
        num_examples: int. Number of elements in `dataset` (before skipping unreadable ones).
        class_names: list of str, in label order.
        skipped: `SkippedImages`, filled by the pipelines as they drop unreadable images.
        make_records: optional `(shuffle: bool, seed: int | None) -> tf.data.Dataset` of
            `(name, payload, label)`, the same elements as `dataset` with a name each, which
            the pipelines use instead of `dataset`: with `shuffle=True` the source shuffles
            where it is cheap (file paths, shard order, indices) before anything is read.
        decode_record: optional `payload -> uint8 (H, W, C)`; may fail on bad data (the
            pipelines guard it). `None` when payloads are already decoded images.
        shuffle_records: bool. True when `make_records(shuffle=True)` shuffles only coarsely
            (e.g. shard order), so the pipelines still need a record shuffle buffer.
    """

    dataset: tf.data.Dataset
    num_examples: int
    class_names: list[str]
    skipped: SkippedImages
    make_records: Callable[[bool, int | None], tf.data.Dataset] | None = None
    decode_record: Callable[[tf.Tensor], tf.Tensor] | None = None
    shuffle_records: bool = False


def decode_encoded_image(data: tf.Tensor) -> tf.Tensor:
    """Decodes JPEG/PNG/GIF/BMP bytes to uint8 `(H, W, 3)` RGB (first frame of a GIF).

    Grayscale images get 3 equal channels; an alpha channel is dropped. Raises
    `tf.errors.InvalidArgumentError` on data that is not a decodable image.
    """
    image = tf.io.decode_image(data, channels=3, expand_animations=False, dtype=tf.uint8)
    image.set_shape([None, None, 3])
    return image


def _read_and_decode(path: tf.Tensor) -> tf.Tensor:
    return decode_encoded_image(tf.io.read_file(path))


def _drop_name(name: tf.Tensor, payload: tf.Tensor, label: tf.Tensor):
    del name
    return payload, label


# --------------------------------------------------------------------------------------
# Image folder
# --------------------------------------------------------------------------------------


def image_folder(
    path: str | os.PathLike,
    *,
    split: str | None = None,
    validation_fraction: float = 0.0,
    seed: int = 0,
) -> ImageSource:
    """A folder with one sub-folder of images per class (the ImageNet layout).

    Class names are the sorted sub-folder names; sub-folders are searched recursively for
    files ending in .jpg/.jpeg/.png/.gif/.bmp (any case). With `validation_fraction > 0`,
    each class's files are shuffled with `seed` and the last `round(fraction * n)` of them
    form the "validation" split, the rest the "training" split: the split is stratified,
    deterministic for a given seed and file set, and the two splits are disjoint.

    Args:
        path: the folder.
        split: None (all files), "training" or "validation".
        validation_fraction: float in [0, 1). Needs `split` when > 0.
        seed: int. Seed of the split.

    Returns:
        An `ImageSource` whose `dataset` yields `(encoded bytes, int32 label)`, in
        (class, file name) order.
    """
    files = list_image_folder(path, split=split, validation_fraction=validation_fraction,
                              seed=seed)
    paths, labels, class_names = files.paths, files.labels, files.class_names
    paths_t = tf.constant(paths, tf.string)
    labels_t = tf.constant(labels, tf.int32)

    def make_records(shuffle: bool, shuffle_seed: int | None) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((paths_t, labels_t))
        if shuffle:
            ds = ds.shuffle(len(paths), seed=shuffle_seed, reshuffle_each_iteration=True)
        return ds.map(lambda p, y: (p, p, y))

    dataset = make_records(False, None).map(
        lambda name, p, y: (tf.io.read_file(p), y), num_parallel_calls=tf.data.AUTOTUNE
    )
    return ImageSource(
        dataset=dataset,
        num_examples=len(paths),
        class_names=class_names,
        skipped=SkippedImages(files.where),
        make_records=make_records,
        decode_record=_read_and_decode,
        shuffle_records=False,
    )


# --------------------------------------------------------------------------------------
# TFRecord shards
# --------------------------------------------------------------------------------------


def tfrecords(
    file_pattern: str | os.PathLike,
    *,
    image_key: str = "image/encoded",
    label_key: str = "image/class/label",
    class_names: list[str] | None = None,
    num_examples: int | None = None,
    label_offset: int = 0,
) -> ImageSource:
    """TFRecord shards of `tf.train.Example`s with an encoded image and an int label.

    Args:
        file_pattern: glob of the shard files (e.g. "/data/train-*-of-01024").
        image_key: feature holding the encoded image (bytes_list).
        label_key: feature holding the class index (int64_list).
        class_names: names in label order; default: "0", "1", ... up to the largest label.
        num_examples: number of records, if known. With both `num_examples` and
            `class_names` given the shards are not scanned; otherwise one pass reads every
            record's label (an I/O pass over the shards) to count them and check labels.
        label_offset: subtracted from the stored label (1 for shards whose labels start at
            1, such as those written by tensorflow/models' ImageNet script).

    Returns:
        An `ImageSource` whose `dataset` yields `(encoded bytes, int32 label)`.
    """
    file_pattern = os.fspath(file_pattern)
    files = sorted(tf.io.gfile.glob(file_pattern))
    if not files:
        raise FileNotFoundError(
            f"No TFRecord files match the pattern. Received: file_pattern={file_pattern!r}"
        )
    features = {
        image_key: tf.io.FixedLenFeature([], tf.string),
        label_key: tf.io.FixedLenFeature([], tf.int64),
    }

    # Check the keys on the first record, so a wrong key is a clear error now.
    first = next(iter(tf.data.TFRecordDataset(files[:1]).take(1)), None)
    if first is not None:
        example = tf.train.Example.FromString(first.numpy())
        present = sorted(example.features.feature.keys())
        for key, kind in ((image_key, "bytes_list"), (label_key, "int64_list")):
            if key not in present or example.features.feature[key].WhichOneof("kind") != kind:
                raise ValueError(
                    f"The records in {files[0]!r} have no {kind} feature {key!r}; their "
                    f"features are {present}. Pass image_key=/label_key= to name them. "
                    f"Received: image_key={image_key!r}, label_key={label_key!r}"
                )

    if num_examples is None or class_names is None:
        label_only = {label_key: tf.io.FixedLenFeature([], tf.int64)}
        labels_ds = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE).map(
            lambda r: tf.io.parse_single_example(r, label_only)[label_key],
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        count, lo, hi = labels_ds.reduce(
            (tf.constant(0, tf.int64), tf.constant(2**62, tf.int64), tf.constant(-1, tf.int64)),
            lambda s, y: (s[0] + 1, tf.minimum(s[1], y), tf.maximum(s[2], y)),
        )
        count, lo, hi = int(count), int(lo) - label_offset, int(hi) - label_offset
        if count == 0:
            raise ValueError(f"The TFRecord files matching {file_pattern!r} hold no records.")
        if lo < 0:
            raise ValueError(
                f"Labels in {file_pattern!r} go down to {lo + label_offset}, below "
                f"label_offset={label_offset}. Received: label_offset={label_offset}"
            )
        if class_names is not None and hi >= len(class_names):
            raise ValueError(
                f"Labels in {file_pattern!r} reach {hi} (after label_offset={label_offset}) "
                f"but only {len(class_names)} class names were given. "
                f"Received: class_names={list(class_names)[:10]}..."
            )
        if num_examples is None:
            num_examples = count
        if class_names is None:
            class_names = [str(i) for i in range(hi + 1)]
    class_names = [str(c) for c in class_names]
    files_t = tf.constant(files, tf.string)

    def parse(name: tf.Tensor, record: tf.Tensor):
        parsed = tf.io.parse_single_example(record, features)
        label = tf.cast(parsed[label_key] - label_offset, tf.int32)
        return name, parsed[image_key], label

    def read_shard(filename: tf.Tensor) -> tf.data.Dataset:
        return (
            tf.data.TFRecordDataset(filename)
            .enumerate()
            .map(lambda i, r: (tf.strings.join([filename, "#", tf.strings.as_string(i)]), r))
        )

    def make_records(shuffle: bool, shuffle_seed: int | None) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices(files_t)
        if shuffle:
            ds = ds.shuffle(len(files), seed=shuffle_seed, reshuffle_each_iteration=True)
        ds = ds.interleave(
            read_shard,
            cycle_length=min(len(files), 16),
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)

    return ImageSource(
        dataset=make_records(False, None).map(_drop_name),
        num_examples=int(num_examples),
        class_names=class_names,
        skipped=SkippedImages(f"TFRecords {file_pattern!r}"),
        make_records=make_records,
        decode_record=decode_encoded_image,
        shuffle_records=True,
    )


# --------------------------------------------------------------------------------------
# TFDS
# --------------------------------------------------------------------------------------


def tfds_source(name: str, split: str, *, data_dir: str | None = None) -> ImageSource:
    """Any image-classification dataset from TensorFlow Datasets, by name.

    The dataset is downloaded and prepared by TFDS if it is not in `data_dir` yet. Images
    are read encoded (`tfds.decode.SkipDecoding`) and decoded by the pipelines' guard, so a
    bad image is skipped and counted like in the other sources.

    Args:
        name: TFDS name, e.g. "imagenette/320px-v2" or "cifar10".
        split: TFDS split, e.g. "train", "validation", "train[:90%]".
        data_dir: TFDS data folder (default: TFDS's own, `~/tensorflow_datasets`).
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:
        raise ImportError(
            "tfds_source() needs the tensorflow-datasets package, which is not installed. "
            "Install it with: pip install tensorflow-datasets"
        ) from err

    builder = tfds.builder(name, data_dir=data_dir)
    builder.download_and_prepare()
    features = builder.info.features
    image_keys = [k for k, f in features.items() if isinstance(f, tfds.features.Image)]
    label_keys = [k for k, f in features.items() if isinstance(f, tfds.features.ClassLabel)]
    if not image_keys or not label_keys:
        raise ValueError(
            f"TFDS dataset {name!r} needs an Image and a ClassLabel feature; its features "
            f"are {dict((k, type(f).__name__) for k, f in features.items())}."
        )
    image_key, label_key = image_keys[0], label_keys[0]
    try:
        num_examples = builder.info.splits[split].num_examples
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(
            f"Unknown split for TFDS dataset {name!r}; it has "
            f"{sorted(builder.info.splits.keys())}. Received: split={split!r}"
        ) from err
    class_names = list(features[label_key].names)

    def make_records(shuffle: bool, shuffle_seed: int | None) -> tf.data.Dataset:
        ds = builder.as_dataset(
            split=split,
            shuffle_files=shuffle,
            decoders={image_key: tfds.decode.SkipDecoding()},
            read_config=tfds.ReadConfig(add_tfds_id=True, shuffle_seed=shuffle_seed),
        )
        return ds.map(
            lambda ex: (ex["tfds_id"], ex[image_key], tf.cast(ex[label_key], tf.int32)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )

    return ImageSource(
        dataset=make_records(False, None).map(_drop_name),
        num_examples=int(num_examples),
        class_names=class_names,
        skipped=SkippedImages(f"TFDS {name!r} split {split!r}"),
        make_records=make_records,
        decode_record=decode_encoded_image,
        shuffle_records=True,
    )


# --------------------------------------------------------------------------------------
# Fashion-MNIST (Debian's dataset-fashion-mnist)
# --------------------------------------------------------------------------------------


def fashion_mnist(
    split: str = "train",
    *,
    data_dir: str | os.PathLike = FASHION_MNIST_DIR,
    limit: int | None = None,
) -> ImageSource:
    """Fashion-MNIST from Debian's `dataset-fashion-mnist` IDX files (no download).

    Args:
        split: "train" (60,000 images) or "test" (10,000).
        data_dir: folder holding the `*-ubyte.gz` files.
        limit: keep only the first `limit` examples (small subsets for tests/demos).

    Returns:
        An `ImageSource` whose `dataset` yields `(uint8 (28, 28, 1), int32 label)`; the
        pipelines repeat the gray channel to RGB.
    """
    images, labels = _limited_fashion_mnist(split, data_dir, limit)
    images_t = tf.constant(images[..., None])
    labels_t = tf.constant(labels.astype(np.int32))
    n = len(images)

    def make_records(shuffle: bool, shuffle_seed: int | None) -> tf.data.Dataset:
        ds = tf.data.Dataset.range(n)
        if shuffle:
            ds = ds.shuffle(n, seed=shuffle_seed, reshuffle_each_iteration=True)
        return ds.map(
            lambda i: (
                tf.strings.join(["#", tf.strings.as_string(i)]),
                tf.gather(images_t, i),
                tf.gather(labels_t, i),
            )
        )

    return ImageSource(
        dataset=tf.data.Dataset.from_tensor_slices((images_t, labels_t)),
        num_examples=n,
        class_names=list(FASHION_MNIST_CLASSES),
        skipped=SkippedImages(f"Fashion-MNIST {split!r}"),
        make_records=make_records,
        decode_record=None,
        shuffle_records=False,
    )
