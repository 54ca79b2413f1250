"""Deprecated module path, kept so that old imports work: the code moved to
`keras_mvit2.weights.download` (the name said Hugging Face hub, beside `keras_mvit2.kerashub`,
KerasHub), whose public names this module re-exports.
"""

import warnings

from keras_mvit2.weights.download import (
    ResolvedWeights,
    WeightsDownloadError,
    download_weights,
    load_pretrained,
)

__all__ = ["ResolvedWeights", "WeightsDownloadError", "download_weights", "load_pretrained"]

warnings.warn(
    "keras_mvit2.weights.hub moved to keras_mvit2.weights.download; import it from there "
    "(the old path will be removed).",
    DeprecationWarning,
    stacklevel=2,
)
