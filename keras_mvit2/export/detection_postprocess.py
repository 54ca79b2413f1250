"""Deprecated module path, kept so that old imports work: the code moved to
`keras_mvit2.export.tflite.detection_postprocess`, whose public names this module re-exports.
"""

import warnings

from keras_mvit2.export.tflite.detection_postprocess import (
    OP_NAME,
    PostProcessOptions,
    append_detection_postprocess,
    check_object_names,
    ssd_settings,
    with_detection_postprocess,
)

__all__ = [
    "OP_NAME",
    "PostProcessOptions",
    "append_detection_postprocess",
    "check_object_names",
    "ssd_settings",
    "with_detection_postprocess",
]

warnings.warn(
    "keras_mvit2.export.detection_postprocess moved to "
    "keras_mvit2.export.tflite.detection_postprocess; import it from there (the old path "
    "will be removed).",
    DeprecationWarning,
    stacklevel=2,
)
