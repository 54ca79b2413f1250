"""Deprecated module path, kept so that old imports work: the code moved to
`keras_mvit2.export.coreml.pointwise_fusion`, whose public names this module re-exports.

Needs coremltools, as before.
"""

import warnings

from keras_mvit2.export.coreml.pointwise_fusion import (
    PASS_NAME,
    collect_fusions,
    fuse_pointwise_conv_pairs,
    pipeline_with_pointwise_fusion,
)

__all__ = [
    "PASS_NAME",
    "collect_fusions",
    "fuse_pointwise_conv_pairs",
    "pipeline_with_pointwise_fusion",
]

warnings.warn(
    "keras_mvit2.export.coreml_pointwise_fusion moved to "
    "keras_mvit2.export.coreml.pointwise_fusion; import it from there (the old path "
    "will be removed).",
    DeprecationWarning,
    stacklevel=2,
)
