"""Deprecated module path, kept so that old imports work: the code moved to
`keras_mvit2.export.tflite.pointwise_fusion`, whose public names this module re-exports.
"""

import warnings

from keras_mvit2.export.tflite.pointwise_fusion import (
    PointwiseFusion,
    fuse_pointwise_convolutions,
    fusion_saves_macs,
)

__all__ = [
    "PointwiseFusion",
    "fuse_pointwise_convolutions",
    "fusion_saves_macs",
]

warnings.warn(
    "keras_mvit2.export.pointwise_fusion moved to "
    "keras_mvit2.export.tflite.pointwise_fusion; import it from there (the old path "
    "will be removed).",
    DeprecationWarning,
    stacklevel=2,
)
