"""Old package paths that keep working after a rename, for one release.

`alias_package("keras_mvit2.latency", "keras_mvit2.latency")` makes ``import
keras_mvit2.latency.host`` give the module ``keras_mvit2.latency.host`` itself (the same
object: a class is the same class, a patched attribute is patched for both names).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types


class _PackageAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``old.X`` for every sub-module X and loads it as ``new.X``."""

    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.old + "."):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> types.ModuleType:
        return importlib.import_module(self.new + spec.name[len(self.old):])

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: `create_module` returned the imported new module."""


def alias_package(old: str, new: str) -> None:
    """Makes every ``old.X`` import ``new.X`` (call it from the old package's __init__)."""
    if not any(isinstance(f, _PackageAlias) and f.old == old for f in sys.meta_path):
        sys.meta_path.insert(0, _PackageAlias(old, new))
