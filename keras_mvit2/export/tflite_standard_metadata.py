"""Deprecated module path, kept so that old imports work: the code moved to
`keras_mvit2.export.tflite.standard_metadata`, whose public names this module re-exports.
"""

import warnings

from keras_mvit2.export.tflite.standard_metadata import (
    DETECTION_OUTPUT_NAMES,
    LABELS_FILE,
    MIN_PARSER_VERSION,
    STANDARD_METADATA_NAME,
    add_standard_metadata,
    embed_standard_metadata,
    image_model_metadata,
    read_standard_metadata,
    standard_metadata_of,
    task_of_outputs,
)

__all__ = [
    "DETECTION_OUTPUT_NAMES",
    "LABELS_FILE",
    "MIN_PARSER_VERSION",
    "STANDARD_METADATA_NAME",
    "add_standard_metadata",
    "embed_standard_metadata",
    "image_model_metadata",
    "read_standard_metadata",
    "standard_metadata_of",
    "task_of_outputs",
]

warnings.warn(
    "keras_mvit2.export.tflite_standard_metadata moved to "
    "keras_mvit2.export.tflite.standard_metadata; import it from there (the old path "
    "will be removed).",
    DeprecationWarning,
    stacklevel=2,
)
