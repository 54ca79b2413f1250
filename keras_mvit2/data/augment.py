"""Augmentation for the tf.data pipelines: Inception-style crop, flip, and the advanced set.

Standard set (Szegedy et al. 2015): random resized crop (`tf.image` has the box sampler;
Keras 3 has no RandomResizedCrop layer) and horizontal flip, written here with stateless TF
ops. Advanced set (the paper's Table 9): Keras 3's own `RandAugment` (`SwitchRandAugment`
runs only the chosen ops) and `RandomErasing`, applied per example (before batching, because
`RandAugment` draws one op sequence per call), and `CutMix` / `MixUp` on batches of one-hot
labels. All of it runs inside `tf.data`, never
inside the model, so nothing of it reaches an exported graph.

Randomness: every example (and every batch) gets its own seed from
`tf.data.Dataset.random(seed, rerandomize_each_iteration=True)`, and every random op derives
its seed from it with `tf.random.experimental.stateless_fold_in`. The Keras layers are fed
those seeds too (through `ElementSeedGenerator`, a `keras.random.SeedGenerator` without
state), so the augmented data are reproducible for a given pipeline seed even with parallel
`map`s, and differ from epoch to epoch.

Images are float32 RGB in [0, 1] after `random_resized_crop` / `eval_transform`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence

import keras
import tensorflow as tf

from keras_mvit2.data.augment_config import AugmentConfig, _is_number
from keras_mvit2.data.batching import to_size

# --------------------------------------------------------------------------------------
# Seeds
# --------------------------------------------------------------------------------------


def fold_seed(seed: tf.Tensor, salt: int) -> tf.Tensor:
    """A new stateless seed (int64 shape (2,)) derived from `seed` and an int `salt`."""
    return tf.random.experimental.stateless_fold_in(seed, salt)


class ElementSeedGenerator(keras.random.SeedGenerator):
    """A Keras `SeedGenerator` without state that hands out seeds derived from a tensor.

    Keras' preprocessing layers draw their randomness from `layer.generator`; in a parallel
    `tf.data` map the shared state would make the draws depend on thread timing. This one
    returns `fold_in(seed, k)` for the k-th draw, `seed` being the example's (or batch's)
    own seed, so the draws are a pure function of that seed.
    """

    def __init__(self, seed: tf.Tensor):  # no super().__init__: no state variable
        self._base_seed = tf.cast(seed, tf.int64)
        self._draws = 0

    def next(self, ordered: bool = True) -> tf.Tensor:
        del ordered
        self._draws += 1
        return fold_seed(self._base_seed, 1000 + self._draws)


@contextlib.contextmanager
def seeded_layer(layer: keras.layers.Layer, seed: tf.Tensor) -> Iterator[keras.layers.Layer]:
    """Within the block (i.e. while a `tf.data` map function is traced), `layer` draws its
    random numbers from `ElementSeedGenerator(seed)` instead of its own state."""
    original = layer.generator
    object.__setattr__(layer, "generator", ElementSeedGenerator(seed))
    try:
        yield layer
    finally:
        object.__setattr__(layer, "generator", original)


# --------------------------------------------------------------------------------------
# Geometry
# --------------------------------------------------------------------------------------


def to_rgb(image: tf.Tensor) -> tf.Tensor:
    """`(H, W, C)` with C in {1, 3, 4} -> `(H, W, 3)`: gray repeated, alpha dropped."""
    channels = image.shape[-1]
    if channels == 3:
        return image
    if channels == 1:
        return tf.image.grayscale_to_rgb(image)
    if channels == 4:
        return image[..., :3]
    if channels is None:
        c = tf.shape(image)[-1]
        rgb = tf.cond(
            tf.equal(c, 1),
            lambda: tf.tile(image, [1, 1, 3]),
            lambda: image[..., :3],
        )
        return tf.ensure_shape(rgb, [None, None, 3])
    raise ValueError(f"Images must have 1, 3 or 4 channels. Received: shape={image.shape}")


def _resize_to_float(image: tf.Tensor, size: tuple[int, int] | tf.Tensor) -> tf.Tensor:
    """uint8/float `(h, w, C)` -> float32 `(size, C)` in [0, 1], bilinear with antialiasing."""
    scale = 1.0 / 255.0 if image.dtype == tf.uint8 else 1.0
    resized = tf.image.resize(tf.cast(image, tf.float32), size, method="bilinear", antialias=True)
    return tf.clip_by_value(resized * scale, 0.0, 1.0)


def sample_crop_box(
    image_shape: tf.Tensor,
    seed: tf.Tensor,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    max_attempts: int = 10,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Samples an Inception-style crop box with `tf.image.stateless_sample_distorted_bounding_box`.

    The box covers an area fraction in `scale` and has width / height in `ratio` (both
    sampled uniformly by TF; torchvision samples the ratio log-uniformly); after
    `max_attempts` misses it is the whole image (torchvision: a center crop).

    Args:
        image_shape: int tensor `(H, W, C)` (e.g. `tf.shape(image)`).
        seed: int tensor of shape (2,), a stateless seed.

    Returns:
        `(offset_y, offset_x, height, width)`, int32 scalars.
    """
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        image_size=image_shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]], tf.float32),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=ratio,
        area_range=scale,
        max_attempts=max_attempts,
        use_image_if_no_bounding_boxes=True,
    )
    return begin[0], begin[1], size[0], size[1]


def crop_and_resize(
    image: tf.Tensor,
    box: tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor],
    size: tuple[int, int] | tf.Tensor,
) -> tf.Tensor:
    """`image[oy:oy+h, ox:ox+w]` resized to `size` (bilinear, antialiased), float32 in [0, 1].

    Args:
        image: uint8 `(H, W, C)` (or float in [0, 1]).
        box: `(offset_y, offset_x, height, width)`.
        size: (height, width).
    """
    oy, ox, h, w = box
    crop = image[oy : oy + h, ox : ox + w, :]
    return _resize_to_float(crop, size)


def random_resized_crop(
    image: tf.Tensor,
    size: tuple[int, int] | tf.Tensor,
    seed: tf.Tensor,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tf.Tensor:
    """Inception-style random resized crop: uint8 `(H, W, C)` -> float32 `(size, C)` in [0, 1]."""
    box = sample_crop_box(tf.shape(image), seed, scale=scale, ratio=ratio)
    return crop_and_resize(image, box, size)


def random_horizontal_flip(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Flips `(H, W, C)` left-right with probability 0.5 (stateless, from `seed`)."""
    flip = tf.random.stateless_uniform([], seed=seed) < 0.5
    return tf.cond(flip, lambda: tf.reverse(image, axis=[1]), lambda: image)


def eval_transform(
    image: tf.Tensor,
    size: int | Sequence[int] | tf.Tensor,
    crop_ratio: float = 0.875,
) -> tf.Tensor:
    """The reference evaluation transform: resize, then center crop; float32 in [0, 1].

    The image is resized (bilinear, antialiased, aspect ratio kept) so that it just covers
    `floor(size / crop_ratio)` on both axes -- for a square `size` that is "the shorter side
    becomes `floor(size / crop_ratio)`" -- and the central `size` is cropped from it.

    Args:
        image: uint8 `(H, W, C)`, C in {1, 3, 4}.
        size: int or (height, width); python ints, or an int32 tensor (height, width)
            (multi-scale pipelines).
        crop_ratio: float in (0, 1]. 1.0: resize to cover `size` and crop nothing more.

    Returns:
        float32 `(height, width, 3)`.
    """
    if not _is_number(crop_ratio) or not 0.0 < crop_ratio <= 1.0:
        raise ValueError(f"`crop_ratio` must be in (0, 1]. Received: crop_ratio={crop_ratio!r}")
    image = to_rgb(image)
    if isinstance(size, tf.Tensor):
        out_h, out_w = size[0], size[1]
    else:
        out_h, out_w = to_size(size)
    target_h = tf.floor(tf.cast(out_h, tf.float32) / crop_ratio)
    target_w = tf.floor(tf.cast(out_w, tf.float32) / crop_ratio)
    shape = tf.cast(tf.shape(image), tf.float32)
    factor = tf.maximum(target_h / shape[0], target_w / shape[1])
    new_h = tf.maximum(tf.cast(tf.round(shape[0] * factor), tf.int32), out_h)
    new_w = tf.maximum(tf.cast(tf.round(shape[1] * factor), tf.int32), out_w)
    resized = _resize_to_float(image, tf.stack([new_h, new_w]))
    top = (new_h - out_h) // 2
    left = (new_w - out_w) // 2
    out = tf.slice(resized, tf.stack([top, left, 0]), tf.stack([out_h, out_w, 3]))
    if not isinstance(size, tf.Tensor):
        out = tf.ensure_shape(out, [out_h, out_w, 3])
    return out


# --------------------------------------------------------------------------------------
# Keras layers
# --------------------------------------------------------------------------------------


class ExactAreaCutMix(keras.layers.CutMix):
    """Keras `CutMix` whose label weight is the exact fraction of pasted pixels.

    Keras computes the weight from the continuous box, which differs from the pixel mask by
    up to a row and a column (several % on small images); timm's `correct_lam` fixes it the
    same way. Everything else (box sampling, permutation) is Keras'.
    """

    def get_random_transformation(self, data, training=True, seed=None):
        transformation = super().get_random_transformation(data, training, seed)
        if transformation is None:
            return None
        masks = tf.cast(transformation["batch_masks"], self.compute_dtype)
        pasted = tf.reduce_mean(masks, axis=[1, 2, 3])  # (B,)
        transformation["mix_weight"] = 1.0 - pasted
        return transformation


class SwitchRandAugment(keras.layers.RandAugment):
    """Keras `RandAugment` that computes only the chosen ops.

    Keras' `RandAugment.transform_images` runs every candidate op (11 of them) for each of
    the `num_ops` slots and keeps one with `where`; this subclass runs just the chosen op per
    slot with `tf.switch_case` (TensorFlow backend, i.e. in `tf.data`). Same random draws,
    same ops, same output; about 10x less work. Apply it to one image (per example), so each
    image gets its own op sequence.
    """

    def transform_images(self, images, transformation, training=True):
        if not training:
            return self.backend.cast(images, self.compute_dtype)
        images = self.backend.cast(images, self.compute_dtype)
        layer_idxes = transformation["layer_idxes"]
        transforms = transformation["transforms"]
        names = list(transforms)
        for i in range(self.num_ops):

            def branch(name, current=images):
                layer = getattr(self, name)
                out = layer.transform_images(current, transforms[name])
                return tf.cast(out, self.compute_dtype)

            images = tf.switch_case(
                tf.cast(layer_idxes[i], tf.int32),
                [functools.partial(branch, n) for n in names],
            )
        return images


class ExampleAugmenter:
    """Per-example training transform: uint8 `(H, W, C)` -> float32 `(size, 3)` in [0, 1].

    Order (as timm / ml-cvnets): random resized crop (or resize + center crop), horizontal
    flip, RandAugment, RandomErasing.

    Args:
        config: `AugmentConfig`.
    """

    def __init__(self, config: AugmentConfig):
        self.config = config
        self.rand_augment = None
        self.random_erasing = None
        if config.rand_augment:
            self.rand_augment = SwitchRandAugment(
                value_range=(0.0, 1.0),
                num_ops=config.rand_augment_ops,
                factor=config.rand_augment_magnitude,
            )
        if config.random_erasing > 0.0:
            p = config.random_erasing
            self.random_erasing = keras.layers.RandomErasing(
                factor=(p, p), fill_value=0.0, value_range=(0.0, 1.0)
            )

    def __call__(
        self, image: tf.Tensor, size: tuple[int, int] | tf.Tensor, seed: tf.Tensor
    ) -> tf.Tensor:
        """Args: image uint8 `(H, W, C)`; size (height, width); seed int64 `(2,)`."""
        cfg = self.config
        image = to_rgb(image)
        if cfg.random_resized_crop:
            out = random_resized_crop(
                image, size, fold_seed(seed, 1), scale=cfg.rrc_scale, ratio=cfg.rrc_ratio
            )
        else:
            out = eval_transform(image, size, crop_ratio=1.0)
        if cfg.horizontal_flip:
            out = random_horizontal_flip(out, fold_seed(seed, 2))
        if self.rand_augment is not None:
            with seeded_layer(self.rand_augment, fold_seed(seed, 3)) as layer:
                out = tf.clip_by_value(layer(out, training=True), 0.0, 1.0)
        if self.random_erasing is not None:
            with seeded_layer(self.random_erasing, fold_seed(seed, 4)) as layer:
                out = layer(out, training=True)
        if not isinstance(size, tf.Tensor):
            out = tf.ensure_shape(out, [size[0], size[1], 3])
        return tf.cast(out, tf.float32)


class BatchMixer:
    """CutMix / MixUp on a batch: `(images (B, H, W, 3), one-hot labels (B, K))` -> soft labels.

    Each batch is mixed with probability `mix_probability`; a mixed batch gets CutMix with
    probability `switch_probability` when both are on. Labels stay convex combinations that
    sum to 1.

    Args:
        config: `AugmentConfig` with `mixes_labels` true.
    """

    def __init__(self, config: AugmentConfig):
        self.config = config
        self.cutmix = None
        self.mixup = None
        if config.cutmix_alpha > 0.0:
            a = config.cutmix_alpha
            self.cutmix = ExactAreaCutMix(factor=(a, a))
        if config.mixup_alpha > 0.0:
            self.mixup = keras.layers.MixUp(alpha=config.mixup_alpha)

    def _apply(self, layer, images, labels, seed):
        with seeded_layer(layer, seed):
            out = layer({"images": images, "labels": labels}, training=True)
        return tf.cast(out["images"], tf.float32), tf.cast(out["labels"], tf.float32)

    def __call__(
        self, images: tf.Tensor, labels: tf.Tensor, seed: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        cfg = self.config
        u = tf.random.stateless_uniform([2], seed=fold_seed(seed, 1))

        def identity():
            return images, labels

        def cutmix():
            return self._apply(self.cutmix, images, labels, fold_seed(seed, 2))

        def mixup():
            return self._apply(self.mixup, images, labels, fold_seed(seed, 3))

        if self.cutmix is not None and self.mixup is not None:
            mixed = lambda: tf.cond(u[1] < cfg.switch_probability, cutmix, mixup)  # noqa: E731
        elif self.cutmix is not None:
            mixed = cutmix
        elif self.mixup is not None:
            mixed = mixup
        else:
            return images, labels
        out_images, out_labels = tf.cond(u[0] < cfg.mix_probability, mixed, identity)
        return (
            tf.ensure_shape(out_images, images.shape),
            tf.ensure_shape(out_labels, labels.shape),
        )
