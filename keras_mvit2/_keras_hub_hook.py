"""Registers `keras_mvit2.kerashub` with KerasHub without importing keras-hub eagerly.

`import keras_mvit2` must stay free of keras-hub (an optional extra, slow to import),
yet KerasHub's `from_preset(dir)` finds a third-party class only once its module is
imported. So: if `keras_hub` is already imported, `keras_mvit2.kerashub` is imported now;
otherwise a one-shot import hook imports `keras_mvit2.kerashub` right after `keras_hub`
itself finishes importing. Either way, whoever calls
`keras_hub.models.ImageClassifier.from_preset(dir)` after `import keras_mvit2` gets
our classes, and users without keras-hub pay nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_HUB = "keras_hub"


def _register() -> None:
    try:
        importlib.import_module("keras_mvit2.kerashub")
    except ImportError as err:  # an incompatible keras-hub must not break `import keras_hub`
        warnings.warn(
            f"keras_mvit2.kerashub could not be imported with this keras-hub ({err}); "
            "MobileViTv2 presets are not registered with KerasHub.",
            stacklevel=3,
        )


class _AfterKerasHubImport(importlib.abc.MetaPathFinder):
    """Finds `keras_hub` with the other finders and runs `_register` after it loads."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _HUB:
            return None
        _uninstall()
        spec = importlib.util.find_spec(_HUB)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register()

        loader.exec_module = exec_then_register
        return spec


_FINDER = _AfterKerasHubImport()


def _uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    """Registers now if keras_hub is imported, else when it is (if it is installed)."""
    if _HUB in sys.modules:
        _register()
    elif _FINDER not in sys.meta_path and _installed():
        sys.meta_path.insert(0, _FINDER)


def _installed() -> bool:
    try:
        return importlib.util.find_spec(_HUB) is not None
    except (ImportError, ValueError):  # a broken or blocked installation: no hook
        return False
