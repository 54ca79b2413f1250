"""Evaluation of a classifier: top-1, top-5, per-class accuracy and the confusion matrix.

`evaluate(model, dataset, class_names)` returns an `EvalResult`; `train` evaluates the
saved models with it, and `keras_mvit2.training.report` writes one as JSON and a PNG.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from keras_mvit2.backend import keras_backend_name

if TYPE_CHECKING:
    import tensorflow as tf


@dataclasses.dataclass
class EvalResult:
    """Classification metrics of one model on one dataset.

    Attributes:
        top1, top5: accuracies in [0, 1] (top-5 is top-k with k = min(5, classes)).
        per_class_accuracy: float array `(num_classes,)`, recall of each class (NaN for a
            class without examples).
        confusion_matrix: int64 array `(num_classes, num_classes)`; rows are true classes,
            columns predicted ones.
        class_names: list of str, in label order.
        num_examples: int.
    """

    top1: float
    top5: float
    per_class_accuracy: np.ndarray
    confusion_matrix: np.ndarray
    class_names: list[str]
    num_examples: int

    def per_class(self) -> dict[str, float]:
        """`{class name: accuracy}`."""
        return dict(zip(self.class_names, (float(a) for a in self.per_class_accuracy), strict=True))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "top1": self.top1,
            "top5": self.top5,
            "num_examples": self.num_examples,
            "per_class_accuracy": {k: (None if np.isnan(v) else v)
                                   for k, v in self.per_class().items()},
            "confusion_matrix": self.confusion_matrix.tolist(),
            "class_names": list(self.class_names),
        }


def evaluate(
    model: keras.Model,
    dataset: tf.data.Dataset | keras.utils.PyDataset,
    class_names: Sequence[str],
    *,
    steps: int | None = None,
) -> EvalResult:
    """Top-1, top-5, per-class accuracy and the confusion matrix of `model` on `dataset`.

    Args:
        model: a classifier returning scores (probabilities or logits) `(B, classes)`.
        dataset: `(images, labels)` batches, labels one-hot / soft `(B, classes)` (argmax
            is the true class) or int `(B,)`, e.g. `keras_mvit2.data.make_eval_dataset`
            or `keras_mvit2.data.PyEvalBatches` (any iterable of batches).
        class_names: the class names, in label order.
        steps: evaluate only the first `steps` batches.

    Returns:
        An `EvalResult`.
    """
    num_classes = len(class_names)
    if num_classes < 1:
        raise ValueError(f"class_names must not be empty. Received: {list(class_names)}")
    if model.output_shape[-1] != num_classes:
        raise ValueError(
            f"The model has {model.output_shape[-1]} outputs but there are {num_classes} "
            f"class names. Received: class_names={list(class_names)}"
        )
    k = min(5, num_classes)
    confusion = np.zeros((num_classes, num_classes), np.int64)
    top5_hits = 0
    convert = keras_backend_name() != "tensorflow"
    for i, (images, labels) in enumerate(dataset):
        if steps is not None and i >= steps:
            break
        if convert:  # JAX / PyTorch take arrays, not tf.data's tensors
            images = np.asarray(images)
        scores = np.asarray(model.predict_on_batch(images))  # Keras' cached predict function
        labels = np.asarray(labels)
        truth = labels.argmax(-1) if labels.ndim == 2 else labels.astype(np.int64)
        np.add.at(confusion, (truth, scores.argmax(-1)), 1)
        topk = np.argpartition(-scores, k - 1, axis=-1)[:, :k]
        top5_hits += int((topk == truth[:, None]).any(-1).sum())
    n = int(confusion.sum())
    if n == 0:
        raise ValueError("The evaluation dataset is empty.")
    support = confusion.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.where(support > 0, np.diag(confusion) / np.maximum(support, 1), np.nan)
    return EvalResult(
        top1=float(np.trace(confusion) / n),
        top5=float(top5_hits / n),
        per_class_accuracy=per_class.astype(np.float64),
        confusion_matrix=confusion,
        class_names=list(class_names),
        num_examples=n,
    )
