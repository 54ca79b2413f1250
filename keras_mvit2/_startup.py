"""Loads TensorFlow and LiteRT without their C++ start-up INFO lines (see `utils.quiet`).

Imported first by `keras_mvit2/__init__.py` (`_startup` sorts before every other module).
Only on Keras' TensorFlow backend: on JAX and PyTorch, `import keras_mvit2` loads neither
(the TensorFlow-only subpackages are imported on first use, see `keras_mvit2.backend`).
"""

from keras_mvit2.backend import keras_backend_name
from keras_mvit2.utils.quiet import native_info_held_back

#: Whether Keras runs (or, once imported, will run) on TensorFlow.
TENSORFLOW_BACKEND: bool = keras_backend_name() == "tensorflow"

if TENSORFLOW_BACKEND:
    with native_info_held_back():
        import ai_edge_litert.interpreter  # noqa: F401
        import tensorflow  # noqa: F401
