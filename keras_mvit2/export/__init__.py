"""Export to mobile formats: TFLite / LiteRT (Android) and Core ML (iPhone), and validation.

`keras_mvit2.export.tflite`, `keras_mvit2.export.coreml` and `keras_mvit2.export.web` (the
browser page) hold one package per target, each registered as an `ExportTarget`
(`keras_mvit2.export.target`: `get_target("tflite")`,
`target_for_path(path)`), the interface `validate`, `mvit2 export`, `mvit2 bench` and the
demo dispatch through; `calibration` (calibration and labelled images), `class_names` and
`validate` serve every target. Above this package, `keras_mvit2.optimizer` ships the
smallest or fastest file of a target within a top-1 budget and `keras_mvit2.latency`
times the files.

Two roads lead to a target's file (`keras_mvit2.export.roads`): TensorFlow's converters on
Keras' TensorFlow backend, and PyTorch's (`torch.export`: litert-torch, coremltools,
coreai-torch) on its PyTorch backend; Core AI (`keras_mvit2.export.coreai`, `.aimodel`) has
the PyTorch road only. On PyTorch this package imports only what the torch road uses (the
registry, the targets and their TensorFlow-free modules); the other names raise
`TensorFlowBackendRequiredError`. On JAX the package raises it when imported.
"""

from keras_mvit2.backend import keras_backend_name, require_tensorflow

_BACKEND = keras_backend_name()
if _BACKEND not in ("tensorflow", "torch"):
    require_tensorflow("keras_mvit2.export (TFLite, Core ML and web export)")

from keras_mvit2.export import roads
from keras_mvit2.export.coreai import (
    CoreAIReport,
    inspect_coreai,
    to_coreai,
)
from keras_mvit2.export.coreml import (
    CoreMLReport,
    coreml_predictions_available,
    inspect_coreml,
    run_coreml,
    to_coreml_via_torch,
)
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
    inspect_tflite,
    read_tflite_metadata,
    run_tflite,
    to_tflite_via_torch,
)

if _BACKEND == "tensorflow":
    from keras_mvit2.export.calibration import (
        LabelledImages,
        calibration_images,
        load_labelled_images,
    )
    from keras_mvit2.export.coreml import to_coreml, to_coreml_detector
    from keras_mvit2.export.equalize import AttentionEqualization, equalize_attention
    from keras_mvit2.export.tflite import (
        UnsupportedOpError,
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
    "CoreAIReport",
    "CoreMLReport",
    "ExportTarget",
    "LabelledImages",
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
    "inspect_coreai",
    "inspect_coreml",
    "inspect_tflite",
    "load_labelled_images",
    "open_page",
    "print_reports",
    "read_tflite_metadata",
    "register_target",
    "roads",
    "run_coreml",
    "run_tflite",
    "save_reports",
    "target_for_path",
    "to_coreai",
    "to_coreml",
    "to_coreml_detector",
    "to_coreml_via_torch",
    "to_tflite",
    "to_tflite_via_torch",
    "validate",
    "with_detection_postprocess",
]

if _BACKEND != "tensorflow":
    __getattr__ = roads.tensorflow_road_getattr(
        __name__, __all__,
        "; on PyTorch the torch road: get_target('tflite').convert(..., road='torch')")
