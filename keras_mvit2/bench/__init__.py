"""Deprecated package path, kept so that old imports work: the benchmark harnesses moved to
`keras_mvit2.latency` (the name said "bench", beside the repository's `benchmarks/`).
``keras_mvit2.bench.X`` is the module ``keras_mvit2.latency.X`` itself.
"""

import importlib
import warnings

from keras_mvit2.utils.moved import alias_package

alias_package(__name__, "keras_mvit2.latency")

warnings.warn(
    "keras_mvit2.bench moved to keras_mvit2.latency; import it from there (the old path will "
    "be removed).",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str):
    return getattr(importlib.import_module("keras_mvit2.latency"), name)
