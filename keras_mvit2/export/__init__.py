"""Export to mobile formats: TFLite / LiteRT (Android) and Core ML (iPhone)."""

from keras_mvit2.export.coreml import (
    CoreMLReport,
    coreml_predictions_available,
    inspect_coreml,
    run_coreml,
    to_coreml,
)
from keras_mvit2.export.tflite import (
    TensorDetails,
    TFLiteReport,
    UnsupportedOpError,
    inspect_tflite,
    run_tflite,
    to_tflite,
)

__all__ = [
    "CoreMLReport",
    "TFLiteReport",
    "TensorDetails",
    "UnsupportedOpError",
    "coreml_predictions_available",
    "inspect_coreml",
    "inspect_tflite",
    "run_coreml",
    "run_tflite",
    "to_coreml",
    "to_tflite",
]
