"""The two roads to a phone file: which converter makes a target's file from a Keras model.

A *target* is a file format and its runtime (`.tflite` for LiteRT, `.mlpackage` for Core ML,
`.aimodel` for Core AI); a *road* is the converter that writes it, chosen by the Keras
backend the model runs on:

============  ================================  =============================  ==================
road          `.tflite` (``"tflite"``)          `.mlpackage` (``"coreml"``)    `.aimodel`
============  ================================  =============================  ==================
"tensorflow"  ``tf.lite.TFLiteConverter``       coremltools from the TF graph  -
              (`to_tflite`)                     (`to_coreml`)
"torch"       litert-torch through Keras'       ``torch.export`` +             ``torch.export`` +
              ``model.export(format="litert")`` coremltools                    coreai-torch
              (`to_tflite_via_torch`)           (`to_coreml_via_torch`)        (`to_coreai`)
============  ================================  =============================  ==================

The road is an option of the existing targets, `ExportTarget.convert(..., road=...)`, not a
target of its own: both roads write the same kind of file, read, run, inspected and
benchmarked by the same code (`target_for_path("x.tflite")` must name one target). The
default road is the backend's (`default_road`). A Keras model belongs to the backend it
was built on, so a road runs only there: the torch road needs ``KERAS_BACKEND=torch``, and
on this stack a PyTorch convolution crashes in a process that has imported TensorFlow, so
the torch road never imports it (coremltools, which imports TensorFlow when installed, is
imported with TensorFlow hidden there: `import_coremltools`). Core AI is a file format and
runtime of its own, hence a target; Apple converts to it from PyTorch only.

This module imports neither Keras nor TensorFlow.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable, Container, Iterator
from typing import Any

from keras_mvit2.backend import keras_backend_name, require_tensorflow

__all__ = [
    "LITERT_TORCH_INSTALL",
    "ROADS",
    "check_road",
    "default_road",
    "import_coremltools",
    "import_litert_torch",
    "tensorflow_road_getattr",
]

#: The roads, the TensorFlow one first.
ROADS = ("tensorflow", "torch")

#: How to install litert-torch without changing the project's pins (see docs/install.md).
LITERT_TORCH_INSTALL = (
    'pip install -e ".[torch,litert-torch]" && pip install --no-deps '
    '"litert-torch==0.10.0" "litert-converter==0.5.0"'
)


def default_road() -> str:
    """The road of this process's Keras backend: ``"torch"`` on PyTorch, else
    ``"tensorflow"`` (JAX has no road of its own; its models save weights that load on
    either)."""
    return "torch" if keras_backend_name() == "torch" else "tensorflow"


def check_road(road: Any, target: str) -> str:
    """`road` (None: `default_road`) if this process can take it, else a clear error.

    Args:
        road: ``"tensorflow"``, ``"torch"`` or None.
        target: the target's name, for the messages (``"tflite"``).

    Returns:
        The road.

    Raises:
        ValueError: an unknown road, or ``"torch"`` asked where Keras does not run on
            PyTorch (the model would not be a PyTorch module).
        TensorFlowBackendRequiredError: ``"tensorflow"`` asked on another backend.
    """
    if road is None:
        road = default_road()
    if road not in ROADS:
        raise ValueError(f"road must be one of {list(ROADS)} (or None: the backend's). "
                         f"Received: road={road!r}")
    backend = keras_backend_name()
    if road == "torch" and backend != "torch":
        raise ValueError(
            f"road='torch' converts a model that Keras runs on PyTorch, and Keras runs on "
            f"{backend!r} here. Run the export with KERAS_BACKEND=torch (set before Keras "
            "is imported), e.g. `KERAS_BACKEND=torch mvit2 export model.keras -o "
            f"out.{'tflite' if target == 'tflite' else 'mlpackage'}`; weights and .keras "
            "files saved on one backend load on the others.")
    if road == "tensorflow":
        require_tensorflow(f"the {target} export's road='tensorflow'")
    return road


def import_litert_torch() -> Any:
    """The `litert_torch` module, or an ImportError naming what to install.

    Imported inside Keras' JAX x64 guard: litert-torch imports JAX and turns on
    ``jax_enable_x64`` when imported, which Keras undoes after its own export; this keeps
    the setting as it was here too.
    """
    if importlib.util.find_spec("litert_torch") is None:
        raise ImportError(
            "The torch road to .tflite needs litert-torch, which is not installed: "
            f"{LITERT_TORCH_INSTALL} (litert-torch's own requirements would downgrade "
            "typing-extensions, pydantic and anyio; these two lines install it beside "
            "the project's pins).")
    from keras_mvit2.backend.keras_internals import preserve_jax_x64_state

    with preserve_jax_x64_state():
        import litert_torch
    return litert_torch


def import_coremltools() -> Any:
    """The `coremltools` module, or an ImportError naming what to install.

    coremltools imports TensorFlow when it is installed (for its TensorFlow frontend). On
    Keras' PyTorch backend, in a process that has not imported TensorFlow, it is imported
    with TensorFlow hidden (`_tensorflow_hidden`): its TensorFlow frontend is then
    disabled, which the torch road does not use, and no TensorFlow is loaded beside
    PyTorch (a PyTorch convolution would crash). Elsewhere it is a plain import.
    """
    if importlib.util.find_spec("coremltools") is None:
        raise ImportError("Core ML export needs coremltools: pip install 'keras_mvit2[coreml]'")
    hide = keras_backend_name() == "torch" and "coremltools" not in sys.modules
    with _tensorflow_hidden() if hide else contextlib.nullcontext():
        import coremltools
    return coremltools


@contextlib.contextmanager
def _tensorflow_hidden() -> Iterator[None]:
    """Within the block, ``import tensorflow`` raises ImportError (unless TensorFlow is
    already imported): a ``None`` entry in `sys.modules`, removed afterwards."""
    if "tensorflow" in sys.modules:
        yield
        return
    sys.modules["tensorflow"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if sys.modules.get("tensorflow", ...) is None:
            del sys.modules["tensorflow"]


def tensorflow_road_getattr(package: str, names: Container[str], hint: str = ""
                            ) -> Callable[[str], Any]:
    """The module `__getattr__` of an export package on JAX and PyTorch: a name of the
    TensorFlow road (`names`, not imported there) raises `TensorFlowBackendRequiredError`
    naming it (`hint` added to the message), any other unknown name an `AttributeError`."""
    def module_getattr(name: str) -> Any:
        if name in names:
            require_tensorflow(f"{package}.{name} (the TensorFlow road{hint})")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return module_getattr
