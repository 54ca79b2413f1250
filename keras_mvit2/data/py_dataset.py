"""Training and evaluation batches as `keras.utils.PyDataset`s (no TensorFlow).

The input of training on the PyTorch backend, which cannot load TensorFlow beside it
(`keras_mvit2.backend.tensorflow_loadable`); `fit`, `evaluate` and `predict` take a
`PyDataset` on every backend. The batches have the layout of the tf.data pipelines
(`keras_mvit2.data.make_train_dataset` / `make_eval_dataset`): images float32
`(B, H, W, 3)` RGB in [0, 1], labels one-hot float32 `(B, num_classes)`.

`PyTrainBatches` is a pass-by-pass shuffled, repeated stream cut into full batches (what
`make_train_dataset(..., repeat=True)` gives): batch `i` holds stream positions
`i * batch_size ...`, position `k` is example `perm(k // N)[k % N]` with each pass's
permutation drawn from `(seed, pass)` and each example's augmentation from `(seed, k)`.
A batch is thus a pure function of the seed and its index: batches read in worker threads,
in any order, or in a resumed run are identical. The augmentation is
`keras_mvit2.data.py_augment` (the standard set; how it differs from the tf.data one is
said there). An unreadable image is skipped (counted in `source.skipped`) and replaced by
the next readable one of the same pass, so every batch is full.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import keras
import numpy as np

from keras_mvit2.data.augment_config import AugmentConfig
from keras_mvit2.data.batching import _num_classes, _positive_int, to_size
from keras_mvit2.data.py_augment import augment_example, check_supported, eval_transform
from keras_mvit2.data.py_sources import PySource

# Salts of the two random streams of a pipeline seed.
_PERMUTATION, _EXAMPLE = 0, 1


def _one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"Label out of range for num_classes={num_classes}: "
                         f"{int(labels.min())} ... {int(labels.max())}.")
    return np.eye(num_classes, dtype=np.float32)[labels]


def _check_source(source: PySource, num_classes: int) -> int:
    if not isinstance(source, PySource):
        raise TypeError("Expected a PySource (keras_mvit2.data.py_image_folder or "
                        f"py_fashion_mnist). Received: {type(source).__name__}")
    return _num_classes(source.class_names, num_classes)


class _Batches(keras.utils.PyDataset):
    """What both batch streams check and keep: the source, output size, batch size, classes."""

    def __init__(self, source: PySource, image_size: int | Sequence[int], batch_size: int,
                 num_classes: int, workers: int, use_multiprocessing: bool,
                 max_queue_size: int):
        super().__init__(workers=workers, use_multiprocessing=use_multiprocessing,
                         max_queue_size=max_queue_size)
        self.num_classes = _check_source(source, num_classes)
        self.source = source
        self.size = to_size(image_size)
        self.batch_size = _positive_int("batch_size", batch_size)

    @property
    def num_batches(self) -> int:
        return len(self)


class PyTrainBatches(_Batches):
    """An epoch of training batches: shuffled, augmented, one-hot, every batch full.

    Args:
        source: a `PySource`.
        image_size: int or (height, width) of the output images.
        batch_size: examples per batch.
        num_classes: length of the one-hot labels.
        steps: batches in this dataset (`len`): one epoch of `fit`; the stream goes on
            across passes over the source as `repeat=True` does.
        augment: `AugmentConfig` (the standard set: crop and flip; the others raise).
        seed: the pipeline seed (`data.seed + epoch` in `train`).
        backend: named in the error for unsupported augmentation.
        workers: threads reading batches (`keras.utils.PyDataset`'s argument).
        use_multiprocessing: processes instead of threads (`keras.utils.PyDataset`'s).
        max_queue_size: batches read ahead (`keras.utils.PyDataset`'s).

    Yields (by index): `(images float32 (B, H, W, 3) in [0, 1], labels float32
    (B, num_classes))`.
    """

    def __init__(self, source: PySource, *, image_size: int | Sequence[int], batch_size: int,
                 num_classes: int, steps: int, augment: AugmentConfig | None = None,
                 seed: int = 0, backend: str = "torch", workers: int = 1,
                 use_multiprocessing: bool = False, max_queue_size: int = 10):
        super().__init__(source, image_size, batch_size, num_classes, workers,
                         use_multiprocessing, max_queue_size)
        self.steps = _positive_int("steps", steps)
        self.augment = augment or AugmentConfig()
        check_supported(self.augment, backend)
        if source.num_examples < self.batch_size:
            raise ValueError(
                f"The source has {source.num_examples} examples, fewer than batch_size="
                f"{batch_size}: training needs full batches. Received: batch_size={batch_size}")
        self.seed = int(seed)
        self._permutations: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.steps

    def _permutation(self, pass_index: int) -> np.ndarray:
        with self._lock:
            if pass_index not in self._permutations:
                rng = np.random.default_rng([self.seed, _PERMUTATION, pass_index])
                self._permutations = {pass_index: rng.permutation(self.source.num_examples)}
            return self._permutations[pass_index]

    def _read(self, position: int) -> tuple[np.ndarray, int]:
        """The example at stream `position`, or the next readable one of its pass."""
        n = self.source.num_examples
        pass_index, within = divmod(position, n)
        order = self._permutation(pass_index)
        for step in range(n):
            i = int(order[(within + step) % n])
            try:
                return self.source.read(i), int(self.source.labels[i])
            except (OSError, ValueError):
                self.source.skipped.record(self.source.name(i))
        raise ValueError(f"No image of {self.source.skipped.where} could be read.")

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= index < self.steps:
            raise IndexError(f"Batch {index} of {self.steps}.")
        images, labels = [], []
        for position in range(index * self.batch_size, (index + 1) * self.batch_size):
            image, label = self._read(position)
            rng = np.random.default_rng([self.seed, _EXAMPLE, position])
            images.append(augment_example(image, self.size, self.augment, rng))
            labels.append(label)
        return np.stack(images), _one_hot(np.asarray(labels), self.num_classes)


class PyEvalBatches(_Batches):
    """Evaluation batches in source order: resize to `size / crop_ratio`, center crop.

    The last batch may be smaller; an unreadable image is skipped (and counted).

    Args:
        source: a `PySource`.
        image_size: int or (height, width) of the output images.
        batch_size: examples per batch.
        num_classes: length of the one-hot labels.
        crop_ratio: float in (0, 1], the fraction of the resized image kept.
        workers: threads reading batches (`keras.utils.PyDataset`'s argument).
        use_multiprocessing: processes instead of threads (`keras.utils.PyDataset`'s).
        max_queue_size: batches read ahead (`keras.utils.PyDataset`'s).
    """

    def __init__(self, source: PySource, *, image_size: int | Sequence[int], batch_size: int,
                 num_classes: int, crop_ratio: float = 0.875, workers: int = 1,
                 use_multiprocessing: bool = False, max_queue_size: int = 10):
        super().__init__(source, image_size, batch_size, num_classes, workers,
                         use_multiprocessing, max_queue_size)
        if isinstance(crop_ratio, bool) or not 0.0 < float(crop_ratio) <= 1.0:
            raise ValueError(f"`crop_ratio` must be in (0, 1]. Received: crop_ratio={crop_ratio!r}")
        self.crop_ratio = float(crop_ratio)

    def __len__(self) -> int:
        return -(-self.source.num_examples // self.batch_size)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= index < len(self):
            raise IndexError(f"Batch {index} of {len(self)}.")
        start = index * self.batch_size
        images, labels = [], []
        for i in range(start, min(start + self.batch_size, self.source.num_examples)):
            try:
                image = self.source.read(i)
            except (OSError, ValueError):
                self.source.skipped.record(self.source.name(i))
                continue
            images.append(eval_transform(image, self.size, self.crop_ratio))
            labels.append(int(self.source.labels[i]))
        if not images:
            return (np.zeros((0, *self.size, 3), np.float32),
                    np.zeros((0, self.num_classes), np.float32))
        return np.stack(images), _one_hot(np.asarray(labels), self.num_classes)
