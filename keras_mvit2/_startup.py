"""Loads TensorFlow and LiteRT without their C++ start-up INFO lines (see `utils.quiet`).

Imported first by `keras_mvit2/__init__.py` (`_startup` sorts before every other module).
"""

from keras_mvit2.utils.quiet import native_info_held_back

with native_info_held_back():
    import ai_edge_litert.interpreter  # noqa: F401
    import tensorflow  # noqa: F401
