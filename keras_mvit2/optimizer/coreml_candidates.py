"""The Core ML packages `keras_mvit2.optimizer` tries: `COMPRESSION_RECIPES`.

Core ML does not run on Linux, so each package's accuracy is measured by running its own
MIL program in TensorFlow with the weights it ships (`predict_with_package_weights`: the
look-up tables and int8 scales applied back by coremltools itself). That is exact for the
float32 package; the float16 programs (every compressed one) are measured with their exact
weights and float32 activations (said in the report as an approximation); W8A8's
activation quantization is only simulated here, so it is built and reported but never
chosen. On macOS the packages run in Core ML itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mvit2.optimizer.candidate import Candidate

__all__ = ["coreml_candidates"]


def coreml_candidates(model: Any, *, calibration_data: np.ndarray,
                      class_names: Sequence[str] | None = None,
                      runs_here: bool = False) -> list[Candidate]:
    """One candidate per `COMPRESSION_RECIPES` entry (calibrated ones on
    `calibration_data`)."""
    from keras_mvit2.export.coreml.recipes import COMPRESSION_RECIPES, EXACT

    names = list(class_names) if class_names is not None else None
    candidates = []
    for name, recipe in COMPRESSION_RECIPES.items():
        def build(path: str, recipe=recipe) -> None:
            from keras_mvit2.export.coreml.convert import to_coreml

            images = calibration_data if recipe.needs_calibration else None
            to_coreml(model, path, class_names=names, **recipe.options(images))

        if runs_here:
            measured_by, exact, measurable = "Core ML", True, True
        else:
            measured_by = "its MIL program and weights, run in TF"
            exact, measurable = recipe.measurement == EXACT, recipe.measurable
        settings = {key: value for key, value in recipe.arguments.items()}
        if recipe.needs_calibration:
            settings["calibration_images"] = len(calibration_data)
        candidates.append(Candidate(
            name, {**settings, "description": recipe.description,
                   "measurement": "Core ML" if runs_here else recipe.measurement},
            build, measured_by, measurable=measurable, exact=exact,
            note=None if runs_here or exact else recipe.measurement,
            float_reference=recipe.arguments.get("quantization") == "float32"))
    return candidates
