"""The optimizer's two disjoint image sets: calibration images and held-out images.

Held-out images are only ever measured on, never used to calibrate: for Fashion-MNIST
the calibration images come from the train split and the held-out ones from the test
split; a folder is read once in a seeded shuffled order (which mixes the classes) and cut
in two, the first `num_calibration` images for calibration and the next `num_held_out`
for measuring (so no file is in both). A folder that holds ``train/`` and ``val/`` (or
``test/``) sub-folders of class folders uses them as the two sets.

`training_images_of` names the training images of the same data (never the held-out ones)
for the quantization-aware-trained candidate: Fashion-MNIST's train split, a folder's
``train/``; a flat folder has none apart from its held-out cut.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from keras_mvit2.export.calibration import FASHION_MNIST, load_labelled_images

__all__ = ["OptimizeData", "load_optimize_data", "training_images_of"]

_HELD_OUT_FOLDERS = ("val", "validation", "test")


@dataclasses.dataclass
class OptimizeData:
    """Calibration and held-out images, float32 `(N, H, W, 3)` in [0, 1].

    Attributes:
        calibration: images the calibrated formats are calibrated on.
        held_out: images every candidate is measured on.
        labels: `(len(held_out),)` int64 class ids of `held_out`.
        class_names: in class-id order.
        source: where the images came from, said in reports (with the two counts).
    """

    calibration: np.ndarray
    held_out: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    source: str

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "num_calibration": len(self.calibration),
                "num_held_out": len(self.held_out), "class_names": self.class_names}


def load_optimize_data(data: str | os.PathLike, *, image_size: tuple[int, int],
                       num_calibration: int = 200, num_held_out: int = 1000,
                       seed: int = 0) -> OptimizeData:
    """Reads `data` (a folder of class sub-folders, or ``"fashion_mnist"``) as two disjoint
    image sets at `image_size` (see the module docstring)."""
    for name, value in (("num_calibration", num_calibration), ("num_held_out", num_held_out)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int. Received: {value!r}")
    spec = os.fspath(data)
    size = tuple(int(d) for d in image_size)
    if spec.lower().replace("-", "_") == FASHION_MNIST:
        calibration = load_labelled_images(f"{FASHION_MNIST}:train", image_size=size,
                                           limit=num_calibration, seed=seed)
        held_out = load_labelled_images(f"{FASHION_MNIST}:test", image_size=size,
                                        limit=num_held_out)
        return OptimizeData(calibration.images[:num_calibration], held_out.images[:num_held_out],
                            held_out.labels[:num_held_out], held_out.class_names,
                            f"{FASHION_MNIST} (calibration: train split; held out: test split)")
    split = _split_folders(spec)
    if split is not None:
        train_dir, held_out_dir = split
        calibration = load_labelled_images(train_dir, image_size=size, limit=num_calibration,
                                           seed=seed)
        held_out = load_labelled_images(held_out_dir, image_size=size, limit=num_held_out,
                                        seed=seed)
        if calibration.class_names != held_out.class_names:
            raise ValueError(
                f"{train_dir!r} and {held_out_dir!r} hold different classes "
                f"({calibration.class_names} vs {held_out.class_names}); give both the same "
                "class sub-folders."
            )
        return OptimizeData(calibration.images[:num_calibration], held_out.images[:num_held_out],
                            held_out.labels[:num_held_out], held_out.class_names,
                            f"{spec} (calibration: {train_dir}; held out: {held_out_dir})")
    images = load_labelled_images(spec, image_size=size, limit=num_calibration + num_held_out,
                                  seed=seed, shuffle=True)
    if len(images.images) <= num_calibration:
        raise ValueError(
            f"{spec!r} has {len(images.images)} readable images, too few for "
            f"{num_calibration} calibration images and a held-out set; add images or lower "
            "the calibration count (num_calibration / --num-calibration)."
        )
    return OptimizeData(images.images[:num_calibration], images.images[num_calibration:],
                        images.labels[num_calibration:], images.class_names,
                        f"{spec} (one seeded shuffle, seed {seed}: the first "
                        f"{num_calibration} images calibrate, the rest are held out)")


def _split_folders(spec: str) -> tuple[str, str] | None:
    """(train, held-out) sub-folders of `spec` where it has both, else None."""
    train = os.path.join(spec, "train")
    if not os.path.isdir(train):
        return None
    for name in _HELD_OUT_FOLDERS:
        candidate = os.path.join(spec, name)
        if os.path.isdir(candidate):
            return train, candidate
    return None


def training_images_of(data: str | os.PathLike) -> str | None:
    """The training images that go with `data` (as `load_optimize_data` reads it), none of
    them held out: ``"fashion_mnist:train"`` for Fashion-MNIST, ``DIR/train`` for a folder
    with ``train/`` and ``val/`` (or ``test/``) sub-folders; None for a flat folder (its
    images are the calibration and held-out ones)."""
    spec = os.fspath(data)
    if spec.lower().replace("-", "_") == FASHION_MNIST:
        return f"{FASHION_MNIST}:train"
    split = _split_folders(spec)
    return None if split is None else split[0]
