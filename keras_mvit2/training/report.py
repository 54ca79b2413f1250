"""Evaluation reports: the confusion-matrix figure and the JSON report of an `EvalResult`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from keras_mvit2.training.evaluation import EvalResult
from keras_mvit2.utils.files import atomic_output, write_json

#: Classes up to which every cell of the confusion matrix is annotated with its count.
ANNOTATE_MAX_CLASSES = 30


def plot_confusion_matrix(
    result: EvalResult,
    path: str | os.PathLike,
    *,
    title: str | None = None,
    cmap: str = "Blues",
    dpi: int = 110,
) -> str:
    """Saves the confusion matrix of `result` as a PNG (atomically), class names on the axes.

    Rows are the true classes, columns the predicted ones. Colours show each row
    normalized by its number of examples (the recall of the diagonal cell), so classes of
    different sizes compare; the cells carry the raw counts (up to
    `ANNOTATE_MAX_CLASSES` classes).

    Args:
        result: an `EvalResult` (e.g. from `training.evaluate`).
        path: the PNG to write.
        title: figure title (default: top-1 / top-5 and the number of examples).
        cmap: matplotlib colour map.
        dpi: resolution.

    Returns:
        `path` as a string.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = np.asarray(result.confusion_matrix)
    n = len(result.class_names)
    if counts.shape != (n, n):
        raise ValueError(
            f"The confusion matrix must be {n}x{n} (one row and column per class name). "
            f"Received: shape={counts.shape}"
        )
    support = counts.sum(1, keepdims=True)
    rates = counts / np.maximum(support, 1)
    side = min(max(4.0, 0.55 * n + 2.5), 40.0)
    fig, ax = plt.subplots(figsize=(side + 1.2, side))
    image = ax.imshow(rates, cmap=cmap, vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true class")
    ax.set_xticks(range(n), labels=result.class_names, rotation=45, ha="right",
                  rotation_mode="anchor")
    ax.set_yticks(range(n), labels=result.class_names)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    if n <= ANNOTATE_MAX_CLASSES:
        for i in range(n):
            for j in range(n):
                if counts[i, j]:
                    ax.text(j, i, str(int(counts[i, j])), ha="center", va="center",
                            fontsize=8, color="white" if rates[i, j] > 0.5 else "black")
    ax.set_title(title or (f"top-1 {100 * result.top1:.2f} %, top-5 {100 * result.top5:.2f} % "
                           f"({result.num_examples} images)"))
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)
    plt.close(fig)
    return os.fspath(path)


def write_eval_report(
    result: EvalResult,
    output_dir: str | os.PathLike,
    *,
    info: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> dict[str, str]:
    """Writes `eval.json` (`result.to_dict()` plus `info`) and `confusion_matrix.png`.

    Both files are written atomically into `output_dir` (created if needed).

    Args:
        result: an `EvalResult`.
        output_dir: the folder.
        info: extra JSON-ready entries of the report (model path, data, image size, ...).
        title: title of the figure (see `plot_confusion_matrix`).

    Returns:
        `{"json": path, "confusion_matrix": path}`.
    """
    output_dir = os.fspath(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    report = {**dict(info or {}), **result.to_dict()}
    json_path = os.path.join(output_dir, "eval.json")
    write_json(json_path, report)
    png_path = plot_confusion_matrix(result, os.path.join(output_dir, "confusion_matrix.png"),
                                     title=title)
    return {"json": json_path, "confusion_matrix": png_path}
