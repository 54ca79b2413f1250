"""Data for the downstream tasks: a real-image segmentation/detection set built offline,
and tf.data pipelines with the augmentations of the paper's Table 11, applied to the
image and its mask / boxes together.

The dataset ("pasted Fashion-MNIST"): real Fashion-MNIST items (Debian package
`dataset-fashion-mnist`, `/usr/share/datasets/fashion-mnist`) pasted onto crops of
the real photos that ship inside scikit-image (`skimage.data.astronaut`, `coffee`,
...; no download). Each item is tinted with a random color and alpha-blended by its
own intensity, so the mask (pixels with alpha >= 0.5) and the box (the mask's tight
extent) are exact. Training and validation images use different Fashion-MNIST splits
(train / test items), different random crops of the photos and different seeds;
`photos="split"` also keeps two photos for validation only (a harder, out-of-scene
check).

Augmentations (Table 11):

- segmentation: random short-side resize, random crop (padded with the ignore
  index), random horizontal flip, photometric distortion, random Gaussian blur,
  random rotation (+-10 degrees; mask nearest, filled with the ignore index);
- detection: SSD cropping (a crop that keeps part of an object; boxes whose centre
  falls outside are dropped), photometric distortion, random horizontal flip, resize.

Every random draw is stateless, from a per-example seed: a pipeline with a seed gives
the same batches on every run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from keras_mvit2.backend import require_tensorflow

# Before anything that loads TensorFlow.
require_tensorflow("keras_mvit2.tasks.data (the task models' tf.data pipelines)")

import tensorflow as tf  # noqa: E402

from keras_mvit2.data.files import FASHION_MNIST_DIR, load_fashion_mnist_arrays  # noqa: E402
from keras_mvit2.tasks.detection import AnchorConfig, match_anchors  # noqa: E402

__all__ = [
    "FASHION_MNIST_DIR",
    "DetectionAugment",
    "PastedDataset",
    "SegmentationAugment",
    "augment_detection_example",
    "augment_segmentation_example",
    "background_photos",
    "detection_dataset",
    "detection_targets",
    "pasted_fashion_mnist",
    "segmentation_dataset",
]

FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
#: scikit-image photos bundled in its wheel (no download).
PHOTOS = ("astronaut", "chelsea", "hubble_deep_field", "immunohistochemistry", "retina",
          "stereo_motorcycle_left", "stereo_motorcycle_right", "coffee", "rocket")
#: With `photos="split"`: the photos kept for validation.
VAL_PHOTOS = ("coffee", "rocket")


# --------------------------------------------------------------------------------------
# Sources


def background_photos(split: str = "all") -> list[np.ndarray]:
    """scikit-image photos as float32 RGB arrays in [0, 1].

    Args:
        split: "all" (the 9 photos of `PHOTOS`), "train" (all but `VAL_PHOTOS`) or
            "val" (`VAL_PHOTOS`).
    """
    try:
        import skimage.data
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "The pasted Fashion-MNIST dataset needs scikit-image's bundled photos: "
            "pip install scikit-image"
        ) from err
    names = {"all": PHOTOS, "val": VAL_PHOTOS,
             "train": tuple(p for p in PHOTOS if p not in VAL_PHOTOS)}.get(split)
    if names is None:
        raise ValueError(f"split must be 'all', 'train' or 'val'. Received: split={split!r}")
    photos = []
    for name in names:
        if name.startswith("stereo_motorcycle"):
            pair = skimage.data.stereo_motorcycle()
            image = pair[0] if name.endswith("left") else pair[1]
        else:
            image = getattr(skimage.data, name)()
        photos.append(np.asarray(image, np.float32)[..., :3] / 255.0)
    return photos


@dataclass
class PastedDataset:
    """Images with their segmentation masks and boxes.

    Attributes:
        images: `(N, H, W, 3)` float32 RGB in [0, 1].
        masks: `(N, H, W)` uint8: 0 background, `1..K` object classes, `ignore_index`
            on the soft item borders (alpha in [0.2, 0.5)) when requested.
        boxes: `(N, max_objects, 4)` float32 corner boxes normalized to [0, 1],
            padded with zeros.
        labels: `(N, max_objects)` int32 classes `1..K`, 0 for padding.
        class_names: the K object class names.
        ignore_index: the mask value of ignored pixels.
    """

    images: np.ndarray
    masks: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    ignore_index: int = 255

    def __len__(self) -> int:
        return len(self.images)

    @property
    def num_classes(self) -> int:
        """Object classes + background."""
        return len(self.class_names) + 1

    def objects(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """`(boxes (n, 4), labels (n,))` of one image, without padding."""
        keep = self.labels[index] > 0
        return self.boxes[index][keep], self.labels[index][keep]


def _resize(array: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinear resize of an (h, w) or (h, w, c) float array with PIL (antialiased)."""
    from PIL import Image

    height, width = size
    if array.ndim == 2:
        return np.asarray(
            Image.fromarray(array.astype(np.float32), mode="F").resize(
                (width, height), Image.BILINEAR
            )
        )
    return np.stack([_resize(array[..., c], size) for c in range(array.shape[-1])], axis=-1)


def pasted_fashion_mnist(
    num_images: int,
    image_size: int = 64,
    *,
    classes: Sequence[int] = (1, 7, 8),
    objects_per_image: tuple[int, int] = (1, 3),
    scale_range: tuple[float, float] = (0.3, 0.6),
    split: str = "train",
    photos: str = "all",
    ignore_borders: bool = False,
    ignore_index: int = 255,
    seed: int = 0,
    fashion_mnist_dir: str | os.PathLike | None = None,
) -> PastedDataset:
    """Builds the pasted Fashion-MNIST segmentation/detection set.

    Args:
        num_images: number of images.
        image_size: side of the square images.
        classes: Fashion-MNIST class ids to paste (default Trouser, Sneaker, Bag);
            they become labels `1..K` in this order.
        objects_per_image: inclusive range of pasted items per image.
        scale_range: item side as a fraction of the image side.
        split: "train" (Fashion-MNIST train items) or "val" (test items).
        photos: "all" (every photo, both splits) or "split" (validation images use
            only `VAL_PHOTOS`, training images the others).
        ignore_borders: label the soft item borders (alpha in [0.2, 0.5)) with
            `ignore_index` in the masks, like the boundary band of PASCAL VOC masks.
        ignore_index: value of ignored mask pixels.
        seed: RNG seed; the same arguments give the same dataset.
        fashion_mnist_dir: folder of the four Fashion-MNIST `*-ubyte.gz` files (default:
            Debian's `dataset-fashion-mnist`, see `keras_mvit2.data.load_fashion_mnist_arrays`).

    Returns:
        A `PastedDataset`. Items overlap each other by at most 25 % of a box (IoU
        <= 0.25); a later item occludes an earlier one.
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val'. Received: split={split!r}")
    if num_images < 1 or image_size < 16:
        raise ValueError(
            f"Need num_images >= 1 and image_size >= 16. Received: {num_images}, {image_size}"
        )
    classes = tuple(int(c) for c in classes)
    if not classes or len(set(classes)) != len(classes) or not set(classes) <= set(range(10)):
        raise ValueError(f"classes must be distinct Fashion-MNIST ids 0..9. Received: {classes}")
    lo, hi = objects_per_image
    if not 1 <= lo <= hi:
        raise ValueError(f"objects_per_image must be (min, max) with 1 <= min <= max: {lo, hi}")
    if not 0.05 <= scale_range[0] <= scale_range[1] <= 1.0:
        raise ValueError(f"scale_range must be within [0.05, 1]. Received: {scale_range}")
    if ignore_index < len(classes) + 1 or ignore_index > 255:
        raise ValueError(f"ignore_index must be in ({len(classes)}, 255]. Got {ignore_index}")

    items, item_labels = load_fashion_mnist_arrays(
        "train" if split == "train" else "test",
        data_dir=fashion_mnist_dir or FASHION_MNIST_DIR,
    )
    pools = [np.nonzero(item_labels == c)[0] for c in classes]
    if photos not in ("all", "split"):
        raise ValueError(f"photos must be 'all' or 'split'. Received: photos={photos!r}")
    photos = background_photos(split if photos == "split" else "all")
    rng = np.random.default_rng(seed)
    size = image_size
    images = np.zeros((num_images, size, size, 3), np.float32)
    masks = np.zeros((num_images, size, size), np.uint8)
    boxes = np.zeros((num_images, hi, 4), np.float32)
    labels = np.zeros((num_images, hi), np.int32)
    for n in range(num_images):
        photo = photos[rng.integers(len(photos))]
        ph, pw = photo.shape[:2]
        side = int(rng.uniform(0.3, 1.0) * min(ph, pw))
        y0, x0 = rng.integers(0, ph - side + 1), rng.integers(0, pw - side + 1)
        image = _resize(photo[y0:y0 + side, x0:x0 + side], (size, size))
        mask = np.zeros((size, size), np.uint8)
        placed: list[np.ndarray] = []
        for _ in range(rng.integers(lo, hi + 1)):
            k = int(rng.integers(len(classes)))
            item = items[pools[k][rng.integers(len(pools[k]))]].astype(np.float32) / 255.0
            for _attempt in range(20):
                s = max(8, round(float(rng.uniform(*scale_range)) * size))
                top, left = rng.integers(0, size - s + 1), rng.integers(0, size - s + 1)
                candidate = np.array([left, top, left + s, top + s], np.float64)
                if not placed or _max_iou(candidate, placed) <= 0.25:
                    break
            else:
                continue
            alpha = np.clip(_resize(item, (s, s)), 0.0, 1.0)
            solid = alpha >= 0.5
            if solid.sum() < 4:
                continue
            color = rng.uniform(0.2, 1.0, 3).astype(np.float32)
            color[rng.integers(3)] = rng.uniform(0.0, 0.2)   # saturated tint
            shade = (0.35 + 0.65 * alpha)[..., None] * color
            region = image[top:top + s, left:left + s]
            image[top:top + s, left:left + s] = region * (1 - alpha[..., None]) + (
                shade * alpha[..., None]
            )
            sub = mask[top:top + s, left:left + s]
            if ignore_borders:
                sub[(alpha >= 0.2) & ~solid] = ignore_index
            sub[solid] = k + 1
            placed.append(candidate)
        # Boxes from the final mask (later items may occlude earlier ones).
        count = 0
        instance_boxes = _instance_boxes(mask, placed, len(classes))
        for box, label in instance_boxes[:hi]:
            boxes[n, count] = box / size
            labels[n, count] = label
            count += 1
        images[n] = np.clip(image, 0.0, 1.0)
        masks[n] = mask
    names = tuple(FASHION_MNIST_CLASSES[c] for c in classes)
    return PastedDataset(images, masks, boxes, labels, names, ignore_index)


def _max_iou(box: np.ndarray, others: list[np.ndarray]) -> float:
    from keras_mvit2.tasks.detection import iou_matrix

    return float(iou_matrix(box[None], np.stack(others)).max())


def _instance_boxes(mask: np.ndarray, placed: list[np.ndarray], num_classes: int):
    """Tight boxes of the visible object pixels inside each pasted square."""
    out = []
    for square in placed:
        x1, y1, x2, y2 = (int(v) for v in square)
        sub = mask[y1:y2, x1:x2]
        visible = (sub >= 1) & (sub <= num_classes)
        if visible.sum() < 4:
            continue
        values, counts = np.unique(sub[visible], return_counts=True)
        label = int(values[np.argmax(counts)])
        own = sub == label
        rows, cols = np.nonzero(own)
        box = np.array([x1 + cols.min(), y1 + rows.min(), x1 + cols.max() + 1,
                        y1 + rows.max() + 1], np.float32)
        out.append((box, label))
    return out


# --------------------------------------------------------------------------------------
# Augmentation (per example, stateless)


@dataclass(frozen=True)
class SegmentationAugment:
    """Table 11 segmentation augmentations (ml-cvnets ADE20k / VOC configs).

    Attributes:
        scale_range: random short-side resize to `crop_size * s`, `s` uniform in range.
        flip: random horizontal flip (p = 0.5).
        photometric: photometric distortion (brightness, contrast, saturation, hue;
            each with p = 0.5).
        blur_probability: random Gaussian blur probability (sigma in [0.1, 1.5]).
        rotation_degrees: random rotation in [-deg, deg] (0 disables).
        noise_std: random Gaussian noise std (0 disables; ml-cvnets enables it).
    """

    scale_range: tuple[float, float] = (0.75, 1.5)
    flip: bool = True
    photometric: bool = True
    blur_probability: float = 0.5
    rotation_degrees: float = 10.0
    noise_std: float = 0.0


@dataclass(frozen=True)
class DetectionAugment:
    """Table 11 detection augmentations (ml-cvnets SSD): SSD cropping, photometric
    distortion, random horizontal flip; the resize is always applied.

    Attributes:
        crop_probability: probability of an SSD crop (else the whole image).
        min_object_covered: choices of the minimum covered fraction of some object.
        area_range, aspect_ratio_range: crop area (fraction) and aspect ratio ranges.
        flip, photometric: as `SegmentationAugment`.
    """

    crop_probability: float = 0.8
    min_object_covered: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
    area_range: tuple[float, float] = (0.3, 1.0)
    aspect_ratio_range: tuple[float, float] = (0.5, 2.0)
    flip: bool = True
    photometric: bool = True


def _uniform(seed, salt: int, minval=0.0, maxval=1.0, shape=()):
    return tf.random.stateless_uniform(
        shape, tf.random.experimental.stateless_fold_in(seed, salt), minval, maxval
    )


def _photometric(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Brightness, contrast, saturation and hue jitter, each with probability 0.5."""
    def maybe(salt, fn, x):
        return tf.cond(_uniform(seed, salt) < 0.5, lambda: fn(x), lambda: x)

    s = [tf.random.experimental.stateless_fold_in(seed, 100 + i) for i in range(4)]
    image = maybe(1, lambda x: tf.image.stateless_random_brightness(x, 0.125, s[0]), image)
    image = maybe(2, lambda x: tf.image.stateless_random_contrast(x, 0.5, 1.5, s[1]), image)
    image = maybe(3, lambda x: tf.image.stateless_random_saturation(x, 0.5, 1.5, s[2]), image)
    image = maybe(4, lambda x: tf.image.stateless_random_hue(x, 0.05, s[3]), image)
    return tf.clip_by_value(image, 0.0, 1.0)


def _gaussian_blur(image: tf.Tensor, sigma: tf.Tensor) -> tf.Tensor:
    radius = 2
    x = tf.range(-radius, radius + 1, dtype=tf.float32)
    k1 = tf.exp(-(x**2) / (2.0 * sigma**2))
    k1 = k1 / tf.reduce_sum(k1)
    kernel = tf.tile((k1[:, None] * k1[None, :])[:, :, None, None], [1, 1, 3, 1])
    padded = tf.pad(image[None], [[0, 0], [radius, radius], [radius, radius], [0, 0]],
                    mode="REFLECT")
    return tf.nn.depthwise_conv2d(padded, kernel, [1, 1, 1, 1], "VALID")[0]


def _rotate(image, mask, degrees, ignore_index):
    """Rotates image (bilinear, fill 0) and mask (nearest, fill ignore) about the center."""
    height = tf.cast(tf.shape(image)[0], tf.float32)
    width = tf.cast(tf.shape(image)[1], tf.float32)
    angle = degrees * math.pi / 180.0
    cos, sin = tf.cos(angle), tf.sin(angle)
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    # Output pixel (x, y) samples the input at R^-1 (x - c) + c.
    transform = tf.stack([cos, -sin, cx - cos * cx + sin * cy,
                          sin, cos, cy - sin * cx - cos * cy, 0.0, 0.0])[None]
    out_shape = tf.shape(image)[:2]
    rotated = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None], transforms=transform, output_shape=out_shape,
        fill_value=0.0, interpolation="BILINEAR", fill_mode="CONSTANT")[0]
    rotated_mask = tf.raw_ops.ImageProjectiveTransformV3(
        images=tf.cast(mask[None, ..., None], tf.float32), transforms=transform,
        output_shape=out_shape, fill_value=float(ignore_index), interpolation="NEAREST",
        fill_mode="CONSTANT")[0, ..., 0]
    return rotated, tf.cast(rotated_mask, mask.dtype)


def augment_segmentation_example(
    image: tf.Tensor,
    mask: tf.Tensor,
    seed: tf.Tensor,
    crop_size: tuple[int, int],
    config: SegmentationAugment = SegmentationAugment(),
    ignore_index: int = 255,
) -> tuple[tf.Tensor, tf.Tensor]:
    """One training example: image `(H, W, 3)` in [0, 1] and mask `(H, W)` transformed
    together (geometry: resize, crop, flip, rotation) to `crop_size`.

    `seed` is a stateless seed (shape `(2,)` int). The same seed gives the same result.
    """
    image = tf.convert_to_tensor(image, tf.float32)
    mask = tf.cast(tf.convert_to_tensor(mask), tf.int32)
    crop_h, crop_w = crop_size
    # Random short-side resize.
    scale = _uniform(seed, 1, *config.scale_range)
    hw = tf.cast(tf.shape(image)[:2], tf.float32)
    short = tf.reduce_min(hw)
    target = float(min(crop_h, crop_w)) * scale
    new_hw = tf.maximum(tf.cast(tf.round(hw * target / short), tf.int32), 1)
    image = tf.image.resize(image, new_hw, method="bilinear")
    mask = tf.image.resize(mask[..., None], new_hw, method="nearest")[..., 0]
    # Pad (image 0, mask ignore) then random crop.
    pad_h = tf.maximum(crop_h - new_hw[0], 0)
    pad_w = tf.maximum(crop_w - new_hw[1], 0)
    image = tf.pad(image, [[0, pad_h], [0, pad_w], [0, 0]])
    mask = tf.pad(mask, [[0, pad_h], [0, pad_w]], constant_values=ignore_index)
    size = tf.shape(mask)
    top = tf.cast(tf.floor(_uniform(seed, 2) * tf.cast(size[0] - crop_h + 1, tf.float32)),
                  tf.int32)
    left = tf.cast(tf.floor(_uniform(seed, 3) * tf.cast(size[1] - crop_w + 1, tf.float32)),
                   tf.int32)
    image = image[top:top + crop_h, left:left + crop_w]
    mask = mask[top:top + crop_h, left:left + crop_w]
    if config.flip:
        flip = _uniform(seed, 4) < 0.5
        image = tf.cond(flip, lambda: image[:, ::-1], lambda: image)
        mask = tf.cond(flip, lambda: mask[:, ::-1], lambda: mask)
    if config.rotation_degrees:
        degrees = _uniform(seed, 5, -config.rotation_degrees, config.rotation_degrees)
        image, mask = _rotate(image, mask, degrees, ignore_index)
    if config.photometric:
        image = _photometric(image, tf.random.experimental.stateless_fold_in(seed, 6))
    if config.blur_probability:
        sigma = _uniform(seed, 7, 0.1, 1.5)
        image = tf.cond(_uniform(seed, 8) < config.blur_probability,
                        lambda: _gaussian_blur(image, sigma), lambda: image)
    if config.noise_std:
        noise = tf.random.stateless_normal(
            tf.shape(image), tf.random.experimental.stateless_fold_in(seed, 9),
            stddev=config.noise_std)
        image = tf.clip_by_value(image + noise, 0.0, 1.0)
    image = tf.ensure_shape(image, (crop_h, crop_w, 3))
    mask = tf.ensure_shape(mask, (crop_h, crop_w))
    return image, mask


def augment_detection_example(
    image: tf.Tensor,
    boxes: tf.Tensor,
    labels: tf.Tensor,
    seed: tf.Tensor,
    image_size: tuple[int, int],
    config: DetectionAugment = DetectionAugment(),
    mask: tf.Tensor | None = None,
):
    """One detection training example: SSD crop, flip, photometric distortion, resize.

    Args:
        image: `(H, W, 3)` float in [0, 1].
        boxes: `(n, 4)` corner boxes normalized to the image.
        labels: `(n,)` labels (>= 1).
        seed: stateless seed `(2,)`.
        image_size: output `(height, width)`.
        config: the augmentation settings.
        mask: optional `(H, W)` integer map transformed with the same geometry
            (nearest); used to check that boxes follow the pixels.

    Returns:
        `(image, boxes, labels)` or `(image, boxes, labels, mask)`; boxes are clipped
        to the crop and renormalized; boxes whose center left the crop are dropped.
    """
    image = tf.convert_to_tensor(image, tf.float32)
    boxes = tf.reshape(tf.convert_to_tensor(boxes, tf.float32), (-1, 4))
    labels = tf.reshape(tf.cast(tf.convert_to_tensor(labels), tf.int32), (-1,))
    hw = tf.shape(image)[:2]
    if config.crop_probability and config.min_object_covered:
        choices = tf.constant(config.min_object_covered, tf.float32)
        pick = tf.cast(_uniform(seed, 1) * len(config.min_object_covered), tf.int32)
        covered = tf.gather(choices, tf.minimum(pick, len(config.min_object_covered) - 1))
        yx_boxes = tf.gather(boxes, [1, 0, 3, 2], axis=1)
        yx_boxes = tf.cond(tf.shape(boxes)[0] > 0, lambda: yx_boxes,
                           lambda: tf.constant([[0.0, 0.0, 1.0, 1.0]]))
        begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.concat([hw, [3]], 0),
            bounding_boxes=yx_boxes[None],
            seed=tf.random.experimental.stateless_fold_in(seed, 2),
            min_object_covered=covered,
            aspect_ratio_range=config.aspect_ratio_range,
            area_range=config.area_range,
            max_attempts=50,
            use_image_if_no_bounding_boxes=True,
        )
        do_crop = _uniform(seed, 3) < config.crop_probability
        top = tf.where(do_crop, begin[0], 0)
        left = tf.where(do_crop, begin[1], 0)
        ch = tf.where(do_crop, crop_size[0], hw[0])
        cw = tf.where(do_crop, crop_size[1], hw[1])
        image = tf.slice(image, [top, left, 0], [ch, cw, 3])
        if mask is not None:
            mask = tf.slice(mask, [top, left], [ch, cw])
        h = tf.cast(hw[0], tf.float32)
        w = tf.cast(hw[1], tf.float32)
        x0, y0 = tf.cast(left, tf.float32) / w, tf.cast(top, tf.float32) / h
        sx, sy = tf.cast(cw, tf.float32) / w, tf.cast(ch, tf.float32) / h
        centers = (boxes[:, :2] + boxes[:, 2:]) / 2.0
        inside = ((centers[:, 0] > x0) & (centers[:, 0] < x0 + sx)
                  & (centers[:, 1] > y0) & (centers[:, 1] < y0 + sy))
        boxes = tf.boolean_mask(boxes, inside)
        labels = tf.boolean_mask(labels, inside)
        offset = tf.stack([x0, y0, x0, y0])
        scale = tf.stack([sx, sy, sx, sy])
        boxes = tf.clip_by_value((boxes - offset) / scale, 0.0, 1.0)
        valid = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        boxes = tf.boolean_mask(boxes, valid)
        labels = tf.boolean_mask(labels, valid)
    if config.flip:
        flip = _uniform(seed, 4) < 0.5
        image = tf.cond(flip, lambda: image[:, ::-1], lambda: image)
        if mask is not None:
            mask = tf.cond(flip, lambda: mask[:, ::-1], lambda: mask)
        flipped = tf.stack([1.0 - boxes[:, 2], boxes[:, 1], 1.0 - boxes[:, 0], boxes[:, 3]],
                           axis=1)
        boxes = tf.cond(flip, lambda: flipped, lambda: boxes)
    if config.photometric:
        image = _photometric(image, tf.random.experimental.stateless_fold_in(seed, 5))
    image = tf.image.resize(image, image_size, method="bilinear")
    image = tf.ensure_shape(image, (*image_size, 3))
    if mask is not None:
        mask = tf.image.resize(mask[..., None], image_size, method="nearest")[..., 0]
        return image, boxes, labels, mask
    return image, boxes, labels


# --------------------------------------------------------------------------------------
# Pipelines


def _indices_with_seeds(count: int, seed: int | None, training: bool) -> tf.data.Dataset:
    """`(index, stateless seed)` pairs: once in order (evaluation), or shuffled anew each
    epoch and repeated forever (training). The shuffles and per-example seeds derive
    from `seed` (`None`: a random one)."""
    if not training:
        return tf.data.Dataset.range(count).map(lambda i: (i, tf.zeros((2,), tf.int64)))
    base = int(np.random.SeedSequence(seed).generate_state(1)[0] % (2**31 - 1))

    def epoch(e):
        epoch_seed = tf.stack([tf.constant(base, tf.int64), e])
        order = tf.random.experimental.stateless_shuffle(
            tf.range(count, dtype=tf.int64), seed=epoch_seed)
        return tf.data.Dataset.from_tensor_slices(order).map(
            lambda i: (i, tf.random.experimental.stateless_fold_in(epoch_seed, i)))

    return tf.data.Dataset.range(2**62).flat_map(epoch)


def _batches(fn, count: int, batch_size: int, seed: int | None,
             training: bool) -> tf.data.Dataset:
    """`fn(index, seed)` over `_indices_with_seeds`, batched (full batches in training)."""
    ds = _indices_with_seeds(count, seed, training)
    ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(batch_size, drop_remainder=training).prefetch(tf.data.AUTOTUNE)


def segmentation_dataset(
    images: np.ndarray,
    masks: np.ndarray,
    batch_size: int,
    *,
    training: bool,
    crop_size: tuple[int, int] | None = None,
    augment: SegmentationAugment | None = SegmentationAugment(),
    ignore_index: int = 255,
    seed: int | None = 0,
) -> tf.data.Dataset:
    """Batches of `(image (B, H, W, 3) float32, mask (B, H, W) int32)`.

    Training: shuffled, repeated forever, augmented (`augment=None` disables it),
    cropped to `crop_size` (default: the image size). Evaluation: in order, once,
    unchanged (images must already share one size).
    """
    images = np.asarray(images, np.float32)
    masks = np.asarray(masks)
    if images.ndim != 4 or masks.shape != images.shape[:3]:
        raise ValueError(
            "images must be (N, H, W, 3) and masks (N, H, W). Received: "
            f"{images.shape}, {masks.shape}"
        )
    crop_size = tuple(crop_size or images.shape[1:3])
    all_images = tf.constant(images)
    all_masks = tf.constant(masks.astype(np.int32))

    def fn(i, s):
        image, mask = tf.gather(all_images, i), tf.gather(all_masks, i)
        if training and augment is not None:
            return augment_segmentation_example(image, mask, s, crop_size, augment, ignore_index)
        return image, mask

    return _batches(fn, len(images), batch_size, seed, training)


def detection_targets(boxes, labels, anchors, config: AnchorConfig):
    """`(A, 5)` float32 training target: `match_anchors` offsets then the label."""
    keep = labels > 0
    locations, matched = match_anchors(
        tf.boolean_mask(boxes, keep), tf.boolean_mask(labels, keep), anchors, config
    )
    return tf.concat([locations, tf.cast(matched, tf.float32)[:, None]], axis=1)


def detection_dataset(
    images: np.ndarray,
    boxes: np.ndarray,
    labels: np.ndarray,
    anchors: np.ndarray,
    batch_size: int,
    *,
    training: bool,
    config: AnchorConfig | None = None,
    image_size: tuple[int, int] | None = None,
    augment: DetectionAugment | None = DetectionAugment(),
    seed: int | None = 0,
) -> tf.data.Dataset:
    """Batches of `(image (B, H, W, 3), target (B, A, 5))` for `SSDLoss`.

    `boxes` `(N, max_objects, 4)` / `labels` `(N, max_objects)` are padded with label
    0. Training: shuffled, repeated, augmented; evaluation: in order, resized only.
    """
    images = np.asarray(images, np.float32)
    boxes = np.asarray(boxes, np.float32)
    labels = np.asarray(labels, np.int32)
    if images.ndim != 4 or boxes.shape[:2] != labels.shape or boxes.shape[0] != len(images):
        raise ValueError(
            "images (N, H, W, 3), boxes (N, M, 4) and labels (N, M) must agree. Received: "
            f"{images.shape}, {boxes.shape}, {labels.shape}"
        )
    image_size = tuple(image_size or images.shape[1:3])
    config = config or AnchorConfig()
    anchors = tf.constant(anchors, tf.float32)
    all_images, all_boxes, all_labels = (tf.constant(a) for a in (images, boxes, labels))

    def fn(i, s):
        image = tf.gather(all_images, i)
        b, lab = tf.gather(all_boxes, i), tf.gather(all_labels, i)
        keep = lab > 0
        b, lab = tf.boolean_mask(b, keep), tf.boolean_mask(lab, keep)
        if training and augment is not None:
            image, b, lab = augment_detection_example(image, b, lab, s, image_size, augment)
        else:
            image = tf.image.resize(image, image_size)
        return image, detection_targets(b, lab, anchors, config)

    return _batches(fn, len(images), batch_size, seed, training)
