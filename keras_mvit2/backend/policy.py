"""Which Keras backend runs, what runs on it, and the TensorFlow-only features' guard.

The policy is read in `keras_mvit2.backend` (the table there); this module holds its
functions: `keras_backend_name` (the one place the backend is read), `require_tensorflow`
and `lazy_attributes` (the guards of the TensorFlow-only parts), `tensorflow_loadable` and
`tensorflow_hidden_from_keras` (where TensorFlow may be loaded beside the backend), and
`variants` (the data and training variant of each backend).

This module imports neither Keras nor TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = [
    "TensorFlowBackendRequiredError",
    "Variants",
    "keras_backend_name",
    "lazy_attributes",
    "require_tensorflow",
    "tensorflow_hidden_from_keras",
    "tensorflow_loadable",
    "variants",
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


@dataclasses.dataclass(frozen=True)
class Variants:
    """The data and training variant a backend runs (`variants`).

    Attributes:
        backend: the Keras backend.
        input_pipeline: ``"tf.data"`` (`keras_mvit2.data`'s pipelines: TensorFlow and JAX)
            or ``"py"`` (its numpy / PIL `py_*` twins: PyTorch, which cannot load
            TensorFlow beside it).
        train_step: ``"tensorflow"`` (`keras_mvit2.training.train_step.ClassifierTrainer`,
            the TensorFlow train step with the recipe's global-batch clipping) or
            ``"keras"`` (`keras_mvit2.training.keras_trainer.KerasClassifierTrainer`,
            Keras' own train step: JAX and PyTorch).
    """

    backend: str
    input_pipeline: str
    train_step: str

    @property
    def tf_data(self) -> bool:
        """Whether the input is tf.data (TensorFlow may be loaded beside the backend)."""
        return self.input_pipeline == "tf.data"

    @property
    def tensorflow_train_step(self) -> bool:
        """Whether training runs the TensorFlow train step (`ClassifierTrainer`)."""
        return self.train_step == "tensorflow"


def variants(backend: str | None = None) -> Variants:
    """The variants of `backend` (None: this process's, `keras_backend_name`).

    | backend      | input pipeline       | train step                        |
    |--------------|----------------------|-----------------------------------|
    | `tensorflow` | `"tf.data"`          | `"tensorflow"` (`ClassifierTrainer`) |
    | `jax`        | `"tf.data"`          | `"keras"` (`KerasClassifierTrainer`) |
    | `torch`      | `"py"` (numpy / PIL) | `"keras"` (`KerasClassifierTrainer`) |

    `keras_mvit2.data` and `keras_mvit2.training` choose their variant here, and only here.
    """
    backend = keras_backend_name() if backend is None else backend
    return Variants(
        backend=backend,
        input_pipeline="py" if backend == "torch" else "tf.data",
        train_step="tensorflow" if backend == "tensorflow" else "keras",
    )


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
    from keras_mvit2.backend.keras_internals import tensorflow_availability

    with tensorflow_availability(False):
        yield


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
