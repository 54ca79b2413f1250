"""Deprecated module path, kept so that old imports work: the code moved to
`keras_mvit2.export.coreml.detection`, whose public names this module re-exports.
"""

import warnings

from keras_mvit2.export.coreml.detection import (
    to_coreml_detector,
)

__all__ = [
    "to_coreml_detector",
]

warnings.warn(
    "keras_mvit2.export.coreml_detection moved to "
    "keras_mvit2.export.coreml.detection; import it from there (the old path "
    "will be removed).",
    DeprecationWarning,
    stacklevel=2,
)
