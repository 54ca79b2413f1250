"""Export to mobile formats: TFLite / LiteRT (Android) and Core ML (iPhone), and validation.

`keras_mvit2.export.tflite`, `keras_mvit2.export.coreml` and `keras_mvit2.export.web` (the
browser page) hold one package per target, each registered as an `ExportTarget`
(`keras_mvit2.export.target`: `get_target("tflite")`,
`target_for_path(path)`), the interface `validate`, `mvit2 export`, `mvit2 bench` and the
demo dispatch through; `calibration` (calibration and labelled images), `class_names` and
`validate` serve every target; `optimize` (`keras_mvit2.export.optimizer`) ships the
smallest or fastest file of a target within a top-1 budget.
"""

# TensorFlow-only: on JAX / PyTorch, a clear error instead of loading TensorFlow.
from keras_mvit2.utils.backend import require_tensorflow

require_tensorflow("keras_mvit2.export (TFLite, Core ML and web export)")

from keras_mvit2.export.calibration import (
    LabelledImages,
    calibration_images,
    load_labelled_images,
)
from keras_mvit2.export.coreml import (
    CoreMLReport,
    coreml_predictions_available,
    inspect_coreml,
    run_coreml,
    to_coreml,
    to_coreml_detector,
)
from keras_mvit2.export.equalize import AttentionEqualization, equalize_attention
from keras_mvit2.export.optimizer import OptimizeResult, OverBudgetError, optimize
from keras_mvit2.export.target import (
    ExportTarget,
    available_targets,
    get_target,
    register_target,
    target_for_path,
)
from keras_mvit2.export.tflite import (
    IO_DTYPES,
    QUANTIZATIONS,
    TensorDetails,
    TFLiteReport,
    UnsupportedOpError,
    inspect_tflite,
    read_tflite_metadata,
    run_tflite,
    to_tflite,
    with_detection_postprocess,
)
from keras_mvit2.export.validate import (
    ValidationReport,
    print_reports,
    save_reports,
    validate,
)
from keras_mvit2.export.web import WebTarget, build_site, open_page

__all__ = [
    "IO_DTYPES",
    "QUANTIZATIONS",
    "AttentionEqualization",
    "CoreMLReport",
    "ExportTarget",
    "LabelledImages",
    "OptimizeResult",
    "OverBudgetError",
    "TFLiteReport",
    "TensorDetails",
    "UnsupportedOpError",
    "ValidationReport",
    "WebTarget",
    "available_targets",
    "build_site",
    "calibration_images",
    "coreml_predictions_available",
    "equalize_attention",
    "get_target",
    "inspect_coreml",
    "inspect_tflite",
    "load_labelled_images",
    "open_page",
    "optimize",
    "print_reports",
    "read_tflite_metadata",
    "register_target",
    "run_coreml",
    "run_tflite",
    "save_reports",
    "target_for_path",
    "to_coreml",
    "to_coreml_detector",
    "to_tflite",
    "validate",
    "with_detection_postprocess",
]
