"""Image sources read with numpy and PIL, without TensorFlow: `PySource`.

The PyTorch backend cannot load TensorFlow beside it (a PyTorch convolution segfaults in a
process that has imported TensorFlow), so its training input is a `keras.utils.PyDataset`
(`keras_mvit2.data.py_dataset`) over these sources instead of `tf.data`. They read the same
files as the tf.data sources (`keras_mvit2.data.files`): an image folder's split holds the
same images on every backend.

Sources: `py_image_folder` (JPEG / PNG / GIF / BMP decoded by PIL) and `py_fashion_mnist`
(Debian's IDX files, in memory). An unreadable image never stops a run: the pipelines skip
it and count it in `source.skipped` (`SkippedFiles`, the interface of the tf.data sources'
`SkippedImages`).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
from collections.abc import Callable

import numpy as np

from keras_mvit2.data.files import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_DIR,
    _limited_fashion_mnist,
    _skipped_report,
    list_image_folder,
)


class SkippedFiles:
    """Counts the unreadable images the PyDataset pipelines skipped, by name.

    The interface of `keras_mvit2.data.SkippedImages` (`count`, `events`, `names()`,
    `reset()`, `report()`), thread-safe (a `PyDataset` may read batches in threads).

    Args:
        where: what the source reads, for the report (e.g. "image folder '/data'").
    """

    def __init__(self, where: str = "the data source"):
        self.where = where
        self._counts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def record(self, name: str) -> None:
        """Counts one failure of `name`."""
        with self._lock:
            self._counts[name] += 1

    @property
    def count(self) -> int:
        """Number of distinct unreadable images seen so far."""
        return len(self._counts)

    @property
    def events(self) -> int:
        """Number of times an unreadable image was skipped (over all epochs)."""
        return sum(self._counts.values())

    def names(self) -> list[str]:
        """Sorted names of the unreadable images seen so far."""
        return sorted(self._counts)

    def reset(self) -> None:
        """Forgets everything counted so far."""
        with self._lock:
            self._counts.clear()

    def report(self, max_names: int = 5) -> str:
        """One message with the count and the first `max_names` names."""
        return _skipped_report(self, max_names, "skip")

    def __repr__(self) -> str:
        return f"SkippedFiles(where={self.where!r}, count={self.count})"


@dataclasses.dataclass
class PySource:
    """A labelled image source read without TensorFlow.

    Attributes:
        num_examples: number of examples (before skipping unreadable ones).
        class_names: list of str, in label order.
        labels: int32 `(num_examples,)`, in `[0, len(class_names))`.
        read: `i -> uint8 (H, W, C)` with C in {1, 3}: example `i`, decoded; raises
            `OSError` / `ValueError` on an unreadable image.
        name: `i -> str`: example `i`'s name in `skipped` (file path, or `#i`).
        skipped: `SkippedFiles`, filled by the pipelines as they skip unreadable images.
    """

    num_examples: int
    class_names: list[str]
    labels: np.ndarray
    read: Callable[[int], np.ndarray]
    name: Callable[[int], str]
    skipped: SkippedFiles

    def limited(self, limit: int | None) -> PySource:
        """The first `limit` examples (all of them when `limit` is None or larger)."""
        if limit is None or limit >= self.num_examples:
            return self
        return dataclasses.replace(self, num_examples=limit, labels=self.labels[:limit])


def _decode_file(path: str) -> np.ndarray:
    """JPEG / PNG / GIF / BMP -> uint8 `(H, W, 3)` RGB: gray repeated, alpha dropped, the
    first frame of a GIF (as `keras_mvit2.data.sources.decode_encoded_image`)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.seek(0)
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, SyntaxError, EOFError) as err:  # PIL's decode errors
        raise ValueError(f"{path!r} is not a readable image: {err}") from err


def py_image_folder(
    path: str | os.PathLike,
    *,
    split: str | None = None,
    validation_fraction: float = 0.0,
    seed: int = 0,
) -> PySource:
    """`keras_mvit2.data.image_folder` read with PIL: the same files, labels and split.

    Args:
        path: the folder, one sub-folder of images per class.
        split: None (all files), "training" or "validation".
        validation_fraction: float in [0, 1). Needs `split` when > 0.
        seed: int. Seed of the split.
    """
    files = list_image_folder(path, split=split, validation_fraction=validation_fraction,
                              seed=seed)
    paths = list(files.paths)
    return PySource(
        num_examples=len(paths),
        class_names=list(files.class_names),
        labels=np.asarray(files.labels, np.int32),
        read=lambda i: _decode_file(paths[i]),
        name=lambda i: paths[i],
        skipped=SkippedFiles(files.where),
    )


def py_fashion_mnist(
    split: str = "train",
    *,
    data_dir: str | os.PathLike = FASHION_MNIST_DIR,
    limit: int | None = None,
) -> PySource:
    """`keras_mvit2.data.fashion_mnist` without TensorFlow: uint8 `(28, 28, 1)` images.

    Args:
        split: "train" (60,000 images) or "test" (10,000).
        data_dir: folder holding Debian's `*-ubyte.gz` files.
        limit: keep only the first `limit` examples.
    """
    images, labels = _limited_fashion_mnist(split, data_dir, limit)
    return PySource(
        num_examples=len(images),
        class_names=list(FASHION_MNIST_CLASSES),
        labels=labels.astype(np.int32),
        read=lambda i: images[i][..., None],
        name=lambda i: f"#{i}",
        skipped=SkippedFiles(f"Fashion-MNIST {split!r}"),
    )
