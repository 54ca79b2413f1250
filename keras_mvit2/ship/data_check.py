"""Small-data guidance before a fine-tuning run: the classes and their image counts per
split, warnings a user sees, and a clear error for data that cannot work.

The hard checks are the data sources' own (`keras_mvit2.data.image_folder`: a missing,
empty or class-less folder; `training.make_sources`: fewer than two classes); this module
adds an unreadable folder, the counts (read from the sources' file lists, no image is
decoded) and the warnings: a class with fewer than `MIN_IMAGES_PER_CLASS` training
images, or a strong imbalance (the largest class over `MAX_IMBALANCE` times the smallest).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

__all__ = ["MAX_IMBALANCE", "MIN_IMAGES_PER_CLASS", "DataCheck", "check_training_data"]

#: Fewer training images than this in a class draws a warning.
MIN_IMAGES_PER_CLASS = 10
#: A largest / smallest class ratio above this draws a warning.
MAX_IMBALANCE = 5.0


@dataclasses.dataclass
class DataCheck:
    """The classes of a run's data and what a user should know about them.

    Attributes:
        class_names: in label order.
        counts: `{"train": [n per class], "validation": [n per class] or None}`.
        warnings: one sentence each (few images, imbalance); empty when all is well.
    """

    class_names: list[str]
    counts: dict[str, list[int] | None]
    warnings: list[str]

    def per_class(self) -> dict[str, dict[str, int | None]]:
        """`{class: {"train": n, "validation": n or None}}`."""
        val = self.counts.get("validation")
        return {name: {"train": self.counts["train"][i],
                       "validation": None if val is None else val[i]}
                for i, name in enumerate(self.class_names)}

    def lines(self) -> list[str]:
        """The class list as printed before training: one line per class."""
        width = max(len(n) for n in self.class_names)
        val = self.counts.get("validation")
        out = []
        for i, name in enumerate(self.class_names):
            held = "" if val is None else f", {val[i]:>5} held out"
            out.append(f"  {i:>3}  {name:<{width}}  {self.counts['train'][i]:>6} training{held}")
        return out


def _label_counts(source, num_classes: int) -> list[int]:
    """Images per class of an `ImageSource` (from its records: paths and labels only) or of
    a `keras_mvit2.data.py_sources.PySource` (PyTorch's input, from its labels)."""
    if isinstance(getattr(source, "labels", None), np.ndarray):
        found = source.labels.astype(np.int64)
        return np.bincount(found, minlength=num_classes).astype(int).tolist()
    if source.make_records is not None:
        labels = source.make_records(False, None).map(lambda name, record, y: y)
    else:
        labels = source.dataset.map(lambda payload, y: y)
    found = np.fromiter(labels.as_numpy_iterator(), dtype=np.int64)
    return np.bincount(found, minlength=num_classes).astype(int).tolist()


def _check_readable(path: str | None) -> None:
    if path and os.path.isdir(path) and not os.access(path, os.R_OK | os.X_OK):
        raise PermissionError(
            f"The image folder {path!r} cannot be read (permission denied); make it "
            "readable (chmod -R u+rX) or copy the photos to a folder you own.")


def check_training_data(config) -> tuple[DataCheck, object, object]:
    """Reads the sources of `config.data` and checks them for a fine-tuning run.

    Args:
        config: a `keras_mvit2.training.TrainConfig`.

    Returns:
        `(DataCheck, train source, validation source or None)`.

    Raises:
        FileNotFoundError, NotADirectoryError, PermissionError, ValueError: data that
            cannot work (missing, a file, unreadable, empty, no class sub-folders, one
            class), with the fix in the message.
    """
    from keras_mvit2.training import make_sources

    for path in (config.data.train, config.data.validation):
        _check_readable(path)
    train, val = make_sources(config)
    names = list(train.class_names)
    counts = {"train": _label_counts(train, len(names)),
              "validation": None if val is None else _label_counts(val, len(names))}
    warnings = []
    few = [f"{n} ({c})" for n, c in zip(names, counts["train"], strict=True)
           if c < MIN_IMAGES_PER_CLASS]
    if few:
        warnings.append(
            f"{len(few)} class(es) have fewer than {MIN_IMAGES_PER_CLASS} training images: "
            f"{', '.join(few[:10])}. Expect poor accuracy on them; add photos (a few dozen "
            "per class is a good start) or try --freeze-backbone.")
    present = [c for c in counts["train"] if c > 0]
    if present and max(present) > MAX_IMBALANCE * min(present):
        big = names[int(np.argmax(counts["train"]))]
        small = names[counts["train"].index(min(present))]
        warnings.append(
            f"The classes are strongly imbalanced: {big} has {max(present)} training images, "
            f"{small} {min(present)} ({max(present) / min(present):.0f}x). The model will "
            "favour the large classes; balance them (more photos of the small ones, or fewer "
            "of the large) if every class matters.")
    return DataCheck(names, counts, warnings), train, val
