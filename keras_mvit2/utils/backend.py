"""Which Keras backend runs, and the TensorFlow-only features' message on the other ones.

The models and layers run on every Keras backend (TensorFlow, JAX, PyTorch; the steps that
differ are chosen in `keras_mvit2.layers.backend_forms`). Some features still need
TensorFlow itself: the TFLite / Core ML / web export (`keras_mvit2.export`), the task
models' training and data (`keras_mvit2.tasks.train`, `keras_mvit2.tasks.data`; the task
models, their losses and metrics run everywhere), quantization (`keras_mvit2.quantize`) and
the profiler. On JAX and PyTorch they say so when imported (`require_tensorflow`) instead of
loading TensorFlow beside the backend (on this stack a PyTorch convolution crashes in a
process that has imported TensorFlow). Classifier training (`keras_mvit2.training`) runs on
every backend; its `tf.data` input loads TensorFlow on TensorFlow and JAX only
(`tensorflow_loadable`), PyTorch reads its images with numpy and PIL.

This module imports neither Keras nor TensorFlow.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = [
    "TensorFlowBackendRequiredError",
    "keras_backend_name",
    "lazy_attributes",
    "require_tensorflow",
    "tensorflow_hidden_from_keras",
    "tensorflow_loadable",
]


class TensorFlowBackendRequiredError(ImportError):
    """A TensorFlow-only feature was used while Keras runs on another backend."""


def keras_backend_name() -> str:
    """The Keras backend of this process, without importing Keras if it is not imported yet.

    Keras' own rule: `keras.backend.backend()` once Keras is imported; before, the
    `KERAS_BACKEND` environment variable, else the `"backend"` of `keras.json` in
    `$KERAS_HOME` (default `~/.keras`, `/tmp/.keras` where the home is read-only), else
    `"tensorflow"`.
    """
    keras = sys.modules.get("keras")
    backend_module = getattr(keras, "backend", None)
    if backend_module is not None and hasattr(backend_module, "backend"):
        return backend_module.backend()
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    if "KERAS_HOME" in os.environ:
        folder = os.environ["KERAS_HOME"]
    else:
        home = os.path.expanduser("~")
        folder = os.path.join(home if os.access(home, os.W_OK) else "/tmp", ".keras")
    try:
        with open(os.path.join(folder, "keras.json")) as f:
            return str(json.load(f).get("backend", "tensorflow"))
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def tensorflow_loadable() -> bool:
    """Whether this process may load TensorFlow beside Keras' backend.

    True on TensorFlow and JAX (Keras' JAX trainer reads `tf.data` datasets; TensorFlow then
    only runs the input pipeline), False on PyTorch: on this stack a PyTorch convolution
    segfaults in a process that has imported TensorFlow, so the PyTorch backend gets
    TensorFlow-free input (`keras_mvit2.data.py_dataset`).
    """
    return keras_backend_name() != "torch"


@contextlib.contextmanager
def tensorflow_hidden_from_keras() -> Iterator[None]:
    """On PyTorch: within the block, Keras sees TensorFlow as not installed.

    Keras uses TensorFlow on every backend whenever it is installed, importing it on first
    use: `keras.utils.set_random_seed` seeds it, `serialize_keras_object` (saving a `.keras`
    model, a learning-rate schedule) checks for its `TensorShape`. On PyTorch that import
    would put TensorFlow beside it (a PyTorch convolution then segfaults on this stack), so
    training there runs inside this block: Keras' lazy `tensorflow` module answers
    "not available" and Keras takes the path it takes without TensorFlow. Nothing changes
    on TensorFlow and JAX, or once TensorFlow is imported.
    """
    if tensorflow_loadable() or "tensorflow" in sys.modules:
        yield
        return
    from keras.src.utils import module_utils

    lazy = module_utils.tensorflow
    saved = lazy._available
    lazy._available = False
    try:
        yield
    finally:
        lazy._available = saved


def require_tensorflow(feature: str) -> None:
    """Raises `TensorFlowBackendRequiredError` unless Keras runs on TensorFlow.

    Args:
        feature: what needs TensorFlow, as the message names it (e.g.
            `"keras_mvit2.export (TFLite / Core ML export)"`).
    """
    backend = keras_backend_name()
    if backend == "tensorflow":
        return
    raise TensorFlowBackendRequiredError(
        f"{feature} needs Keras' TensorFlow backend, and Keras runs on {backend!r} here. "
        "The models and layers run on every backend; this feature does not yet. Run it "
        "with KERAS_BACKEND=tensorflow (set before Keras is imported), e.g. "
        "`KERAS_BACKEND=tensorflow mvit2 ...`; weights saved on one backend "
        "(`model.save_weights`, `.weights.h5`) load on the others."
    )


def lazy_attributes(package: str, table: Mapping[str, tuple[str, str | None]]
                    ) -> Callable[[str], Any]:
    """A package's module `__getattr__` that imports the names of `table` on first use.

    A package imports its TensorFlow-only parts eagerly on the TensorFlow backend only; on
    JAX and PyTorch their names stay in `table`, `name -> (module, attribute)` (`None`: the
    module itself), and are imported when first used: a module that needs TensorFlow
    calls `require_tensorflow` when imported, so the name raises
    `TensorFlowBackendRequiredError` there instead of loading TensorFlow.

    Args:
        package: the package's name, for the `AttributeError` of other names.
        table: the lazily imported names.
    """
    def module_getattr(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import importlib

        module_name, attribute = table[name]
        module = importlib.import_module(module_name)
        return module if attribute is None else getattr(module, attribute)

    return module_getattr
