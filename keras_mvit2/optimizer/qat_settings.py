"""The short quantization-aware training of the ``qat_int8`` file: its images and schedule.

`QATSettings` (and `qat_settings`, the command lines' ``--qat-steps`` / ``--qat-lr`` /
``--qat-epochs``) say what the ``qat_int8`` candidate trains on and how long; the
optimizer (`keras_mvit2.optimizer`) and `mvit2 finetune` build it from them with
`keras_mvit2.quantize.qat`. This module needs no TensorFlow: `mvit2 finetune` checks the
settings before training on every Keras backend (the file itself is built on the TensorFlow
backend).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["QAT_BATCH_SIZE", "QAT_CANDIDATE", "QAT_EPOCHS", "QAT_LEARNING_RATE", "QAT_MAX_STEPS",
           "QATSettings", "qat_settings"]

#: The quantization-aware-trained candidate's name.
QAT_CANDIDATE = "qat_int8"

#: The short QAT of the `qat_int8` candidate: `QAT_EPOCHS` passes over the training images
#: read (`QAT_MAX_STEPS * QAT_BATCH_SIZE` of them at most: at most `QAT_MAX_STEPS` steps a
#: pass), at this Adam learning rate, this many images a step, towards the float model's
#: own probabilities (distillation).
QAT_MAX_STEPS = 300
QAT_EPOCHS = 3
QAT_LEARNING_RATE = 1e-6
QAT_BATCH_SIZE = 8


@dataclasses.dataclass(frozen=True)
class QATSettings:
    """The training images and schedule of the ``qat_int8`` candidate.

    Attributes:
        train_data: labelled training images, never the held-out ones: a folder of class
            sub-folders (the same classes, in the same order, as the model's), a
            Fashion-MNIST split (``"fashion_mnist:train"``), a `keras_mvit2.data.ImageSource`
            (a fine-tuning run's training split) or ``(images, labels)`` arrays (float32 in
            [0, 1]).
        max_steps: a pass over the images read is capped at this many steps (at most
            ``max_steps * batch_size`` images are read).
        epochs: passes over the images read.
        learning_rate: Adam's learning rate (1e-6 by default; `keras_mvit2.quantize.qat`).
        batch_size: images per step.
        crop_ratio: the centre crop of the images read (default: the reader's, 0.875 for
            folders, 1.0 for Fashion-MNIST).
        verbose: print the training's progress lines.
    """

    train_data: Any
    max_steps: int = QAT_MAX_STEPS
    learning_rate: float = QAT_LEARNING_RATE
    batch_size: int = QAT_BATCH_SIZE
    crop_ratio: float | None = None
    verbose: bool = False
    epochs: int = QAT_EPOCHS

    def __post_init__(self) -> None:
        for name, option in (("max_steps", "--qat-steps"), ("epochs", "--qat-epochs"),
                             ("batch_size", None)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                where = f" ({option}; 0 there: no quantization-aware training)" if option else ""
                raise ValueError(f"QATSettings.{name}{where} must be a positive int. "
                                 f"Received: {value!r}")
        rate = self.learning_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
            raise ValueError("QATSettings.learning_rate (--qat-lr) must be a number above 0. "
                             f"Received: {rate!r}")

    def describe(self) -> dict[str, Any]:
        """The settings as the report records them (the images by where they come from)."""
        data = self.train_data
        if isinstance(data, tuple | list):
            source = f"{len(data[0])} images given as arrays"
        elif isinstance(data, str | os.PathLike):
            source = os.fspath(data)
        else:
            source = getattr(getattr(data, "skipped", None), "where", None) or type(data).__name__
        return {"train_data": source, "max_steps": self.max_steps, "epochs": self.epochs,
                "learning_rate": self.learning_rate, "batch_size": self.batch_size}

    def images(self, image_size: tuple[int, int],
               class_names: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`(images, labels)`: at most `max_steps * batch_size` training images (a seeded,
        class-mixed subset), checked against the model's `class_names` where given."""
        limit = self.max_steps * self.batch_size
        data = self.train_data
        if isinstance(data, tuple | list):
            images, labels = np.asarray(data[0], np.float32), np.asarray(data[1], np.int64)
            return images[:limit], labels[:limit]
        from keras_mvit2.export.calibration import load_labelled_images

        read = load_labelled_images(data, image_size=tuple(image_size), limit=limit,
                                    split="train", shuffle=True, crop_ratio=self.crop_ratio)
        if class_names is not None and list(read.class_names) != list(class_names):
            raise ValueError(
                f"The training images ({read.source}) hold the classes {read.class_names}, "
                f"the held-out images {list(class_names)}; give training images of the same "
                "class sub-folders (--train-data)."
            )
        return read.images, read.labels


def qat_settings(train_data: Any, *, steps: int = QAT_MAX_STEPS,
                 learning_rate: float = QAT_LEARNING_RATE, epochs: int = QAT_EPOCHS,
                 crop_ratio: float | None = None,
                 verbose: bool = False) -> QATSettings | None:
    """The `QATSettings` of the command lines' ``--qat-steps`` / ``--qat-lr`` /
    ``--qat-epochs`` for `train_data`, or None (no ``qat_int8``) for 0 steps or no training
    images (None); an invalid value is a ValueError naming the option."""
    if steps == 0 or train_data is None:
        return None
    return QATSettings(train_data, max_steps=steps, learning_rate=learning_rate,
                       epochs=epochs, crop_ratio=crop_ratio, verbose=verbose)
