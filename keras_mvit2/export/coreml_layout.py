"""Deprecated module path, kept so that old imports work: the code moved to
`keras_mvit2.export.coreml.layout`, whose public names this module re-exports.
"""

import warnings

from keras_mvit2.export.coreml.layout import channels_first_block, coreml_layout

__all__ = ["channels_first_block", "coreml_layout"]

warnings.warn(
    "keras_mvit2.export.coreml_layout moved to keras_mvit2.export.coreml.layout; import it "
    "from there (the old path will be removed).",
    DeprecationWarning,
    stacklevel=2,
)
