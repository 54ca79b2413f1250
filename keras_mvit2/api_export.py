"""Serialization registration shared by every public layer of keras_mvit2."""

import keras

PACKAGE = "keras_mvit2"

#: Class decorator: registers a layer so that `.keras` files reload it by name
#: (``"keras_mvit2>ClassName"``) once `keras_mvit2` is imported.
serializable = keras.saving.register_keras_serializable(package=PACKAGE)
