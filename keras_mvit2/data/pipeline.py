"""tf.data pipelines: `ImageSource` -> batched, prefetched `(images, labels)` for Keras.

Training (`make_train_dataset`): shuffle (where the source makes it cheap: file paths,
shard order, indices; plus a record buffer for record-level sources), guarded parallel decode
(unreadable images are dropped and counted in `source.skipped`), per-example augmentation
(parallel map), one-hot labels, batch (drop_remainder), CutMix/MixUp on batches, prefetch.

Evaluation (`make_eval_dataset`): source order, guarded decode, resize + center crop, batch
(the last batch may be smaller), prefetch.

Multi-scale training (`make_multiscale_train_dataset`): ml-cvnets' variable batch sampler,
see its docstring.

Outputs: images float32 `(B, H, W, 3)` RGB in [0, 1]; labels float32 `(B, num_classes)`,
one-hot, or soft when CutMix/MixUp mixed them.

Determinism: with an int `seed`, the order of examples, every augmentation draw and every
batch composition depend only on the seed and the epoch (two pipelines built with the same
seed yield identical batches; each new pass over a dataset reshuffles and re-augments). With
`seed=None` the pipeline is nondeterministic and tf.data may reorder for speed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from keras_mvit2.data.augment import (
    AugmentConfig,
    BatchMixer,
    ExampleAugmenter,
    eval_transform,
    to_size,
)
from keras_mvit2.data.batching import (
    DEFAULT_SCALES,
    _num_classes,
    _positive_int,
    multiscale_batch_pairs,
)
from keras_mvit2.data.sources import ImageSource, SkippedImages, decode_encoded_image

AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_SHUFFLE_BUFFER = 10_000
_GUARD_CYCLE = 16  # nested decode datasets open at once

# Offsets that give each random stream of a pipeline its own seed.
_SHUFFLE_INDEX, _SHUFFLE_RECORDS, _EXAMPLE_SEEDS, _BATCH_SEEDS, _SCALE_SEEDS = range(5)


# --------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------


def _check_source(source: Any, num_classes: Any) -> int:
    if not isinstance(source, ImageSource):
        raise TypeError(
            "Expected an ImageSource (from keras_mvit2.data.image_folder, tfrecords, "
            f"tfds_source or fashion_mnist). Received: {type(source).__name__}"
        )
    return _num_classes(source.class_names, num_classes)


def _check_seed(seed: Any) -> int | None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"`seed` must be an int or None. Received: seed={seed!r}")
    return seed


def _sub_seed(seed: int | None, offset: int) -> int | None:
    return None if seed is None else seed * 7919 + offset


def _augment_config(augment: Any) -> AugmentConfig:
    if augment is None:
        return AugmentConfig()
    if isinstance(augment, AugmentConfig):
        return augment
    if isinstance(augment, Mapping):
        return AugmentConfig.from_dict(augment)
    raise ValueError(
        f"`augment` must be an AugmentConfig, a dict or None. Received: {type(augment).__name__}"
    )


# --------------------------------------------------------------------------------------
# Decoding with a guard
# --------------------------------------------------------------------------------------


def _records(
    source: ImageSource, *, shuffle: bool, seed: int | None, shuffle_buffer: int
) -> tuple[tf.data.Dataset, Any]:
    """`(name, payload, label)` records, shuffled when asked, and the payload decoder."""
    if source.make_records is not None:
        records = source.make_records(shuffle, _sub_seed(seed, _SHUFFLE_INDEX))
        decode = source.decode_record
        buffer_needed = source.shuffle_records
    else:
        records = source.dataset.enumerate().map(
            lambda i, example: (
                tf.strings.join(["#", tf.strings.as_string(i)]),
                example[0],
                example[1],
            )
        )
        is_encoded = source.dataset.element_spec[0].dtype == tf.string
        decode = decode_encoded_image if is_encoded else None
        buffer_needed = True
    if shuffle and buffer_needed:
        records = records.shuffle(
            shuffle_buffer, seed=_sub_seed(seed, _SHUFFLE_RECORDS), reshuffle_each_iteration=True
        )
    return records, decode


def guarded_decode(
    records: tf.data.Dataset, decode: Any, skipped: SkippedImages
) -> tf.data.Dataset:
    """`(name, payload, label)` -> `(uint8 image, int32 label)`, dropping undecodable ones.

    Each record becomes a one-element nested dataset, `decode(payload)` with
    `ignore_errors()`, followed by a fallback element that records `name` in `skipped`;
    `take(1)` keeps the decoded image, or the fallback when the decode failed (the fallback
    is only evaluated then). The nested datasets run in a parallel `interleave` with
    `block_length=1` (as fast as a plain parallel map), so the output keeps the input order;
    flagged fallbacks are filtered out.
    """
    if decode is None:
        return records.map(lambda name, image, label: (image, tf.cast(label, tf.int32)))

    def decode_or_flag(name, payload, label):
        label = tf.cast(label, tf.int32)
        decoded = (
            tf.data.Dataset.from_tensors(payload)
            .map(lambda p: (decode(p), label, tf.constant(True)))
            .ignore_errors()
        )
        spec = decoded.element_spec[0]
        empty = tf.zeros([0] * (spec.shape.rank - 1) + [spec.shape[-1] or 0], spec.dtype)

        def flag(unused):
            with tf.control_dependencies([skipped.record(name)]):
                return empty, label, tf.constant(False)

        fallback = tf.data.Dataset.from_tensors(0).map(flag)
        return decoded.concatenate(fallback).take(1)

    return (
        records.interleave(
            decode_or_flag,
            cycle_length=_GUARD_CYCLE,
            block_length=1,
            num_parallel_calls=AUTOTUNE,
        )
        .filter(lambda image, label, ok: ok)
        .map(lambda image, label, ok: (image, label))
    )


def _with_seeds(dataset: tf.data.Dataset, seed: int | None) -> tf.data.Dataset:
    """Appends a per-element stateless seed (int64 (2,)) that changes every epoch."""
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).map(
        lambda r: tf.stack([r, tf.constant(0x5EED, tf.int64)])
    )
    return tf.data.Dataset.zip(dataset, seeds).map(lambda example, s: (*example, s))


def _one_hot(label: tf.Tensor, num_classes: int) -> tf.Tensor:
    checks = [
        tf.debugging.assert_non_negative(label, message="Negative label."),
        tf.debugging.assert_less(
            label,
            tf.constant(num_classes, label.dtype),
            message=f"Label out of range for num_classes={num_classes}.",
        ),
    ]
    with tf.control_dependencies(checks):
        return tf.one_hot(label, num_classes, dtype=tf.float32)


def _options(seed: int | None) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = seed is not None
    return options


def _decoded_training_examples(
    source: ImageSource, *, seed: int | None, shuffle_buffer: int, repeat: bool
) -> tf.data.Dataset:
    records, decode = _records(source, shuffle=True, seed=seed, shuffle_buffer=shuffle_buffer)
    if repeat:
        records = records.repeat()
    return guarded_decode(records, decode, source.skipped)


# --------------------------------------------------------------------------------------
# Public pipelines
# --------------------------------------------------------------------------------------


def make_train_dataset(
    source: ImageSource,
    *,
    image_size: int | Sequence[int],
    batch_size: int,
    num_classes: int,
    augment: AugmentConfig | Mapping[str, Any] | None = None,
    seed: int | None = 0,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    repeat: bool = False,
) -> tf.data.Dataset:
    """Training batches: shuffled, augmented, batched (drop_remainder) and prefetched.

    Args:
        source: an `ImageSource`.
        image_size: int or (height, width) of the output images.
        batch_size: examples per batch; a last incomplete batch is dropped.
        num_classes: length of the one-hot labels (>= the source's number of classes).
        augment: `AugmentConfig` (or a dict for `AugmentConfig.from_dict`); default: the
            standard set (random resized crop + horizontal flip).
        seed: int for a reproducible pipeline, None for a nondeterministic (faster) one.
        shuffle_buffer: record buffer for sources that can only shuffle coarsely (TFRecord
            shards, TFDS files, in-memory datasets without an index); sources with an index
            (image folders, Fashion-MNIST) shuffle all of it every epoch anyway.
        repeat: repeat forever (then pass `steps_per_epoch` to `fit`).

    Returns:
        `tf.data.Dataset` of `(images float32 (B, H, W, 3) in [0, 1], labels float32
        (B, num_classes))`, batch dimension static.
    """
    num_classes = _check_source(source, num_classes)
    size = to_size(image_size)
    batch_size = _positive_int("batch_size", batch_size)
    shuffle_buffer = _positive_int("shuffle_buffer", shuffle_buffer)
    seed = _check_seed(seed)
    config = _augment_config(augment)
    augmenter = ExampleAugmenter(config)
    if source.num_examples < batch_size:
        raise ValueError(
            f"The source has {source.num_examples} examples, fewer than batch_size="
            f"{batch_size}: training drops incomplete batches, so there would be none. "
            f"Received: batch_size={batch_size}"
        )

    examples = _decoded_training_examples(
        source, seed=seed, shuffle_buffer=shuffle_buffer, repeat=repeat
    )
    examples = _with_seeds(examples, _sub_seed(seed, _EXAMPLE_SEEDS)).map(
        lambda image, label, s: (augmenter(image, size, s), _one_hot(label, num_classes)),
        num_parallel_calls=AUTOTUNE,
    )
    batches = examples.batch(batch_size, drop_remainder=True, num_parallel_calls=AUTOTUNE)
    batches = _mix(batches, config, seed)
    return batches.prefetch(AUTOTUNE).with_options(_options(seed))


def _mix(batches: tf.data.Dataset, config: AugmentConfig, seed: int | None) -> tf.data.Dataset:
    if not config.mixes_labels:
        return batches
    mixer = BatchMixer(config)
    return _with_seeds(batches, _sub_seed(seed, _BATCH_SEEDS)).map(
        lambda images, labels, s: mixer(images, labels, s), num_parallel_calls=AUTOTUNE
    )


def make_eval_dataset(
    source: ImageSource,
    *,
    image_size: int | Sequence[int],
    batch_size: int,
    num_classes: int,
    crop_ratio: float = 0.875,
) -> tf.data.Dataset:
    """Evaluation batches in source order: resize to `size / crop_ratio`, then center crop.

    Args:
        source: an `ImageSource`.
        image_size: int or (height, width) of the output images.
        batch_size: examples per batch (the last batch may be smaller).
        num_classes: length of the one-hot labels.
        crop_ratio: float in (0, 1], the fraction of the resized image kept (0.875: 224
            from 256).

    Returns:
        `tf.data.Dataset` of `(images float32 (B, H, W, 3) in [0, 1], one-hot float32
        (B, num_classes))`.
    """
    num_classes = _check_source(source, num_classes)
    size = to_size(image_size)
    batch_size = _positive_int("batch_size", batch_size)
    if (
        isinstance(crop_ratio, bool)
        or not isinstance(crop_ratio, (int, float))
        or not (0.0 < crop_ratio <= 1.0)
    ):
        raise ValueError(f"`crop_ratio` must be in (0, 1]. Received: crop_ratio={crop_ratio!r}")
    records, decode = _records(source, shuffle=False, seed=None, shuffle_buffer=1)
    examples = guarded_decode(records, decode, source.skipped).map(
        lambda image, label: (
            eval_transform(image, size, crop_ratio),
            _one_hot(label, num_classes),
        ),
        num_parallel_calls=AUTOTUNE,
    )
    return examples.batch(batch_size).prefetch(AUTOTUNE).with_options(_options(0))


# --------------------------------------------------------------------------------------
# Multi-scale training (ml-cvnets' variable batch sampler)
# --------------------------------------------------------------------------------------


def make_multiscale_train_dataset(
    source: ImageSource,
    *,
    base_size: int,
    base_batch_size: int,
    num_classes: int,
    scales: Sequence[float] = DEFAULT_SCALES,
    size_divisor: int = 32,
    batch_multiple: int = 1,
    augment: AugmentConfig | Mapping[str, Any] | None = None,
    seed: int | None = 0,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    repeat: bool = False,
) -> tf.data.Dataset:
    """Training batches whose resolution changes per batch at constant memory (ml-cvnets).

    The (size, batch) pairs are `multiscale_batch_pairs(base_size, base_batch_size, scales,
    size_divisor=..., batch_multiple=...)`: sizes are multiples of `size_divisor` and each
    batch size is `floor(base_batch_size * (base_size / size)**2)`, so every batch holds at
    most (and nearly) as many pixels as a base batch. As in ml-cvnets' sampler, each batch
    picks one pair uniformly at random and takes the next `batch` examples of the shuffled
    stream, so an epoch still visits every example once; an incomplete last batch is
    dropped.

    Every batch has the concrete shape `(batch, size, size, 3)` of its pair, one of
    `len(pairs)` shapes; the dataset's `element_spec` has unknown batch and spatial
    dimensions, so a training step traced per concrete shape (or with `reduce_retracing`)
    handles them. Arguments as `make_train_dataset`.

    Returns:
        `tf.data.Dataset` of `(images float32 (b, s, s, 3), labels float32 (b, num_classes))`.
    """
    num_classes = _check_source(source, num_classes)
    pairs = multiscale_batch_pairs(
        base_size,
        base_batch_size,
        scales,
        size_divisor=size_divisor,
        batch_multiple=batch_multiple,
    )
    shuffle_buffer = _positive_int("shuffle_buffer", shuffle_buffer)
    seed = _check_seed(seed)
    config = _augment_config(augment)
    augmenter = ExampleAugmenter(config)
    batches = tf.constant([p[1] for p in pairs], tf.int64)
    n_pairs = len(pairs)

    examples = _decoded_training_examples(
        source, seed=seed, shuffle_buffer=shuffle_buffer, repeat=repeat
    )
    examples = _with_seeds(examples, _sub_seed(seed, _EXAMPLE_SEEDS))

    # Assign runs of consecutive examples to scales: a run of `batch` examples per batch.
    def assign(state, example):
        remaining, index = state
        image, label, s = example
        new_index = tf.random.stateless_uniform(
            [],
            seed=tf.random.experimental.stateless_fold_in(s, _SCALE_SEEDS),
            minval=0,
            maxval=n_pairs,
            dtype=tf.int32,
        )
        start = tf.equal(remaining, 0)
        index = tf.where(start, new_index, index)
        remaining = tf.where(start, batches[index], remaining) - 1
        return (remaining, index), (image, label, s, index)

    examples = examples.scan((tf.constant(0, tf.int64), tf.constant(0, tf.int32)), assign)

    def transform(image, label, s, index):
        # One branch per scale, each with a static output size (Keras' layers need it).
        branches = [functools.partial(augmenter, image, (size, size), s) for size, _ in pairs]
        return tf.switch_case(index, branches), _one_hot(label, num_classes), index

    examples = examples.map(transform, num_parallel_calls=AUTOTUNE)
    grouped = examples.group_by_window(
        key_func=lambda image, label, index: tf.cast(index, tf.int64),
        reduce_func=lambda key, window: window.batch(batches[key]),
        window_size_func=lambda key: batches[key],
    )
    grouped = grouped.filter(
        lambda images, labels, index: tf.equal(
            tf.cast(tf.shape(images)[0], tf.int64), batches[index[0]]
        )
    )
    if config.mixes_labels:
        mixer = BatchMixer(config)

        def mix(images, labels, index, s):
            # One branch per scale with the batch's static shape (Keras' CutMix needs it).
            def branch(size, batch):
                x = tf.ensure_shape(images, [batch, size, size, 3])
                y = tf.ensure_shape(labels, [batch, num_classes])
                return mixer(x, y, s)

            branches = [functools.partial(branch, size, batch) for size, batch in pairs]
            return tf.switch_case(tf.cast(index[0], tf.int32), branches)

        grouped = _with_seeds(grouped, _sub_seed(seed, _BATCH_SEEDS)).map(
            mix, num_parallel_calls=AUTOTUNE
        )
    else:
        grouped = grouped.map(lambda images, labels, index: (images, labels))
    return grouped.prefetch(AUTOTUNE).with_options(_options(seed))
