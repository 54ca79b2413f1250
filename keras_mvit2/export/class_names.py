"""The class-name checks every export target applies before it writes names into a file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras


def check_object_names(class_names: Any, num_classes: int) -> list[str]:
    """`class_names` as strings, one per object class (background excluded), or a
    ValueError that says how many the detector has."""
    names = [str(n) for n in class_names]
    if len(names) != num_classes:
        raise ValueError(
            f"class_names has {len(names)} entries but the detector has {num_classes} "
            "object classes. Pass one name per object class (background excluded), in "
            "class-id order."
        )
    return names


def check_class_names(class_names: Any, model: keras.Model) -> list[str] | None:
    """`class_names` as strings, one per output class of `model`, or a ValueError that says
    what the model needs.

    A classifier `(batch, classes)` or a segmenter `(batch, height, width, classes)` takes
    one name per class, in output order; a detector with its post-process
    (`with_detection_postprocess`) one per object class, background excluded.
    """
    if class_names is None:
        return None
    if isinstance(class_names, (str, bytes)) or not isinstance(class_names, Sequence):
        raise ValueError(
            "class_names must be a list of strings, one per output class. "
            f"Received: {type(class_names).__name__}"
        )
    names = [str(c) for c in class_names]
    postprocess = getattr(model, "detection_postprocess", None)  # with_detection_postprocess
    if postprocess is not None:
        return check_object_names(names, postprocess.num_classes)
    output_shape = tuple(model.outputs[0].shape) if getattr(model, "outputs", None) else ()
    if len(model.outputs or []) != 1 or len(output_shape) not in (2, 4):
        raise ValueError(
            "class_names needs a classifier with one output of shape (batch, classes) or a "
            "segmenter with one output (batch, height, width, classes). "
            f"Received: output shapes {[tuple(o.shape) for o in model.outputs or []]}"
        )
    if output_shape[-1] != len(names):
        raise ValueError(
            f"class_names has {len(names)} entries but the model outputs {output_shape[-1]} "
            "classes. Pass one name per class, in output order."
        )
    return names
