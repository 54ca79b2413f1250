"""Which export targets the optimizer has candidates for, and how it gets them.

`CANDIDATES` maps an export target's name to the function listing its candidate files
(`keras_mvit2.optimizer.tflite_candidates`, `keras_mvit2.optimizer.coreml_candidates`);
`QAT_CANDIDATES` maps it to its quantization-aware-trained candidate (``qat_int8``, TFLite
only). A new export target becomes optimizable by an entry here: the targets themselves
(`keras_mvit2.export`) know nothing of the optimizer, which stands above them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from keras_mvit2.optimizer.candidate import Candidate

__all__ = ["CANDIDATES", "QAT_CANDIDATES", "candidates_of", "qat_candidate_of"]


def _tflite(target: Any, model: Any, *, calibration_data: np.ndarray,
            class_names: Sequence[str] | None) -> list[Candidate]:
    from keras_mvit2.optimizer.tflite_candidates import tflite_candidates

    return tflite_candidates(model, calibration_data=calibration_data,
                             class_names=class_names)


def _coreml(target: Any, model: Any, *, calibration_data: np.ndarray,
            class_names: Sequence[str] | None) -> list[Candidate]:
    from keras_mvit2.optimizer.coreml_candidates import coreml_candidates

    return coreml_candidates(model, calibration_data=calibration_data,
                             class_names=class_names, runs_here=target.can_run())


def _tflite_qat(model: Any, settings: Any, *, calibration_data: np.ndarray,
                class_names: Sequence[str] | None = None,
                training_class_names: Sequence[str] | None = None,
                io_dtype: str | None = None,
                held_out: tuple[np.ndarray, np.ndarray] | None = None) -> Candidate:
    from keras_mvit2.optimizer.tflite_candidates import qat_candidate

    return qat_candidate(model, settings, calibration_data=calibration_data,
                         class_names=class_names, training_class_names=training_class_names,
                         io_dtype=io_dtype or "float32", held_out=held_out)


#: Export target name -> `f(target, model, *, calibration_data, class_names)`, its candidates.
CANDIDATES: dict[str, Callable[..., list[Candidate]]] = {"tflite": _tflite, "coreml": _coreml}
#: Export target name -> `f(model, settings, *, calibration_data, class_names,
#: training_class_names, io_dtype, held_out)`, its ``qat_int8`` candidate.
QAT_CANDIDATES: dict[str, Callable[..., Candidate]] = {"tflite": _tflite_qat}


def candidates_of(target: Any, model: Any, *, calibration_data: np.ndarray,
                  class_names: Sequence[str] | None = None) -> list[Candidate]:
    """The files the optimizer tries for `model` in export target `target`.

    Args:
        target: the `keras_mvit2.export.ExportTarget`.
        model: the float Keras model.
        calibration_data: float32 images `(N, H, W, 3)` in [0, 1] for calibrated formats
            (never the held-out ones).
        class_names: written into every file.

    Raises:
        NotImplementedError: the target has no candidates (not in `CANDIDATES`).
    """
    if target.name not in CANDIDATES:
        raise NotImplementedError(f"{target.display_name} has no optimizer candidates.")
    return CANDIDATES[target.name](target, model, calibration_data=calibration_data,
                                   class_names=class_names)


def qat_candidate_of(target: Any, model: Any, settings: Any, *, calibration_data: np.ndarray,
                     class_names: Sequence[str] | None = None,
                     training_class_names: Sequence[str] | None = None,
                     io_dtype: str | None = None,
                     held_out: tuple[np.ndarray, np.ndarray] | None = None) -> Candidate:
    """The quantization-aware-trained candidate (``"qat_int8"``) of `target` for `model`,
    whose build trains on `settings.train_data` (`keras_mvit2.optimizer.QATSettings`).

    Args:
        target: the `keras_mvit2.export.ExportTarget`.
        model: the float Keras model.
        settings: the training images and schedule (`QATSettings`).
        calibration_data: float32 images for the converter's calibration.
        class_names: written into the file.
        training_class_names: the classes the training images must hold, in the model's
            order (default: `class_names`).
        io_dtype: the file's input / output type (default: the target's int8 file's).
        held_out: held-out ``(images, labels)`` the choice between the quantization-aware-
            trained and the post-training file is judged on first.

    Raises:
        NotImplementedError: the target has no such candidate (not in `QAT_CANDIDATES`).
    """
    if target.name not in QAT_CANDIDATES:
        raise NotImplementedError(
            f"{target.display_name} has no quantization-aware-trained candidate.")
    return QAT_CANDIDATES[target.name](model, settings, calibration_data=calibration_data,
                                       class_names=class_names,
                                       training_class_names=training_class_names,
                                       io_dtype=io_dtype, held_out=held_out)
