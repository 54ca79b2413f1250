"""Deprecated package path, kept so that old imports (and KerasHub presets saved with this
module path) work: the KerasHub integration moved to `keras_mvit2.kerashub` (the name said
"hub", beside the Hugging Face downloads). ``keras_mvit2.hub.X`` is the module
``keras_mvit2.kerashub.X`` itself.
"""

import warnings

from keras_mvit2.kerashub import *  # noqa: F403  (the public names, as before)
from keras_mvit2.kerashub import __all__  # noqa: F401
from keras_mvit2.utils.moved import alias_package

alias_package(__name__, "keras_mvit2.kerashub")

warnings.warn(
    "keras_mvit2.hub moved to keras_mvit2.kerashub; import it from there (the old path will "
    "be removed).",
    DeprecationWarning,
    stacklevel=2,
)
